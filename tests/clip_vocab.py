"""The real CLIP vocabulary as a tokenizer folder, for the tokenizer and Stable Diffusion tests.

The vocabulary is built as CLIP builds it from the merges file open_clip ships
(``bpe_simple_vocab_16e6.txt.gz``): the 256 byte characters, the same with ``</w>``, one
token per merge, then ``<|startoftext|>`` and ``<|endoftext|>``.  open_clip is only located,
never imported."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import pytest

from diffusion.tokenizers.clip_bpe import bytes_to_unicode

MERGES = 49152 - 256 - 2  # CLIP's merge count: lines 1..48894 of the file
VOCAB_SIZE = 2 * 256 + MERGES + 2


def clip_merges_file() -> Path:
    """open_clip's ``bpe_simple_vocab_16e6.txt.gz``, located without importing open_clip."""
    spec = importlib.util.find_spec("open_clip")
    if spec is None or spec.origin is None:
        pytest.skip("open_clip_torch (the source of CLIP's merges file) is not installed")
    return Path(spec.origin).parent / "bpe_simple_vocab_16e6.txt.gz"


def write_clip_folder(folder: Path, pad_token: str, normalized: bool = True) -> Path:
    """A tokenizer folder as Stable Diffusion ships one, on the real CLIP vocabulary."""
    merges = gzip.open(clip_merges_file()).read().decode("utf-8").split("\n")[1:MERGES + 1]
    chars = list(bytes_to_unicode().values())
    vocab = chars + [c + "</w>" for c in chars] + ["".join(m.split()) for m in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(vocab)}))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")

    def token(content: str) -> dict:
        return {"content": content, "lstrip": False, "normalized": normalized, "rstrip": False, "single_word": False}

    specials = {"bos_token": token("<|startoftext|>"), "eos_token": token("<|endoftext|>"),
                "unk_token": token("<|endoftext|>"), "pad_token": pad_token}
    config = {"add_prefix_space": False, "do_lower_case": True, "errors": "replace", "model_max_length": 77,
              "tokenizer_class": "CLIPTokenizer", **{k: {"__type": "AddedToken", **v} if isinstance(v, dict) else v
                                                      for k, v in specials.items()}}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (folder / "special_tokens_map.json").write_text(json.dumps(specials, indent=2))
    return folder
