"""CLIPTokenizer against transformers' on the real CLIP vocabulary, token for token.

The vocabulary is built as CLIP builds it from the merges file open_clip ships
(``bpe_simple_vocab_16e6.txt.gz``): the 256 byte characters, the same with ``</w>``, one
token per merge, then ``<|startoftext|>`` and ``<|endoftext|>``.  open_clip is only located,
never imported."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from diffusion import CLIPTokenizer
from clip_vocab import write_clip_folder

transformers = pytest.importorskip("transformers")

PROMPTS = [
    "a photo of a cat", "A Photo Of A CAT", "", "   ", "  hello   world  ", "tab\there\nnew line\r\n",
    "(masterpiece:1.2), best quality, [ugly:0.5], {extra}, ((double))", "hello!! wow?! ...", "don't it's we're I'VE 'tis o'clock",
    "user's cats' toys", "naïve café résumé", "e\u0301 vs \u00e9", "İstanbul ß ﬁ Σσ ΣΑΣ", "Ａｂｃ １２３",
    "日本語のテキスト", "中文提示词", "한국어", "Привет мир", "مرحبا", "😀👍🏽🏳️‍🌈", "1234.5678 3.14 1e-5 $5 #tag @user",
    "a<|endoftext|>b", "<|startoftext|>x<|endoftext|>", "<|ENDOFTEXT|> <|StartOfText|>", "<|endoftext", "a\x1cb a\u00a0b a\u3000b",
    "a\u200bb", "over-the-top snake_case path/to\\file e=mc^2 ~x~", "the quick brown fox jumps over the lazy dog " * 8,
    "x" * 200,
]


@pytest.fixture(scope="module", params=["sd1", "sd2", "raw"])
def pair(request, tmp_path_factory) -> tuple[CLIPTokenizer, object, Path]:
    """(ours, transformers', folder) on SD-1.x's folder (pad ``<|endoftext|>``), SD-2.x's (pad ``!``),
    and one whose special tokens all match the raw text only."""
    pad, normalized = {"sd1": ("<|endoftext|>", True), "sd2": ("!", True), "raw": ("<|endoftext|>", False)}[request.param]
    folder = write_clip_folder(tmp_path_factory.mktemp(request.param), pad, normalized)
    return CLIPTokenizer.from_pretrained(folder), transformers.CLIPTokenizer.from_pretrained(folder), folder


def assert_same(ours: CLIPTokenizer, theirs, texts, **kwargs) -> None:
    want, got = theirs(texts, **kwargs), ours(texts, **kwargs)
    assert got.input_ids == want["input_ids"], (texts, kwargs)
    assert got.attention_mask == want["attention_mask"], (texts, kwargs)


def test_prompts_match_transformers(pair) -> None:
    ours, theirs, _ = pair
    assert (ours.pad_token_id, ours.model_max_length) == (theirs.pad_token_id, theirs.model_max_length)
    for prompt in PROMPTS:
        assert_same(ours, theirs, prompt)


# Any text but surrogates and code points this Python's Unicode database leaves unassigned:
# characters assigned in later Unicode versions are letters to transformers, not to unicodedata.
TEXT = st.lists(st.one_of(st.characters(blacklist_categories=("Cs", "Cn")),
                          st.sampled_from(["'s", "'t", "'", " ", "!", "<|endoftext|>", "A"])), max_size=40).map("".join)


@given(text=TEXT)
def test_drawn_texts_match_transformers(pair, text) -> None:
    ours, theirs, _ = pair
    assert_same(ours, theirs, text)


def test_padding_and_truncation_match_transformers(pair) -> None:
    ours, theirs, _ = pair
    for kwargs in (dict(padding="max_length", max_length=77, truncation=True), dict(padding=True),
                   dict(padding="max_length", max_length=40), dict(max_length=10), dict(truncation=True),
                   dict(padding="max_length", truncation=True), dict(padding="longest", truncation=True, max_length=16)):
        assert_same(ours, theirs, PROMPTS, **kwargs)
        assert_same(ours, theirs, PROMPTS[-2], **kwargs)


def test_folders_saved_by_either_side_read_alike(pair, tmp_path) -> None:
    """transformers 5 saves tokenizer.json (no vocab.json, merges.txt); ours saves the four files."""
    ours, theirs, _ = pair
    theirs.save_pretrained(tmp_path / "theirs")
    assert_same(CLIPTokenizer.from_pretrained(tmp_path / "theirs"), theirs, PROMPTS)
    ours.save_pretrained(tmp_path / "ours")
    again = CLIPTokenizer.from_pretrained(tmp_path / "ours")
    assert_same(again, transformers.CLIPTokenizer.from_pretrained(tmp_path / "ours"), PROMPTS,
                padding="max_length", truncation=True)
    assert again(PROMPTS).input_ids == ours(PROMPTS).input_ids


def test_arrays_and_encoding_access(pair) -> None:
    ours = pair[0]
    single = ours("a photo", padding="max_length", return_tensors="np")
    assert single.input_ids.shape == (1, 77) and single.input_ids.dtype == np.int64
    assert single["attention_mask"].sum() == 4 and dict(single).keys() == {"input_ids", "attention_mask"}
    batch = ours(["a", "a photo of a cat"], padding=True, return_tensors="np")
    assert batch.input_ids.shape == (2, 7)
    with pytest.raises(ValueError, match="return_tensors='np' needs sequences of one length"):
        ours(["a", "a photo of a cat"], return_tensors="np")


def test_bad_arguments_and_folders_raise(pair, tmp_path) -> None:
    ours, _, folder = pair
    with pytest.raises(ValueError, match="padding must be one of"):
        ours("a", padding="left")
    with pytest.raises(ValueError, match="max_length must be an int >= 2"):
        ours("a", max_length=1, truncation=True)
    with pytest.raises(ValueError, match="return_tensors must be None or 'np'"):
        ours("a", return_tensors="pt")
    with pytest.raises(TypeError, match="a text must be a str, got int"):
        ours(["a", 3])
    with pytest.raises(FileNotFoundError, match="no vocab.json"):
        CLIPTokenizer.from_pretrained(tmp_path)
    ours.save_pretrained(tmp_path)
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b c\n")
    with pytest.raises(ValueError, match="line 2 is not a merge pair"):
        CLIPTokenizer.from_pretrained(tmp_path)
    (tmp_path / "vocab.json").unlink()
    (tmp_path / "vocab.json").symlink_to(folder / "vocab.json")
    with pytest.raises(ValueError, match="'vocab.json' leads outside"):
        CLIPTokenizer.from_pretrained(tmp_path)
