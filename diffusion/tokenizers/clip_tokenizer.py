"""CLIPTokenizer: transformers' CLIP tokenizer, read from the same folder, giving the same ids.

    tokenizer = CLIPTokenizer.from_pretrained("sd-1.5/tokenizer")
    ids = tokenizer(["a photo of a cat"], padding="max_length", truncation=True, return_tensors="np").input_ids

A folder holds ``vocab.json`` (token -> id) and ``merges.txt`` (the BPE merges, most
frequent first, after a ``#version`` line), or instead ``tokenizer.json`` (both, and the
added tokens, as transformers 5 saves them), then ``tokenizer_config.json``
(``model_max_length`` and the special tokens) and, from older transformers versions,
``special_tokens_map.json``.
Each sequence is ``<|startoftext|>``, the text's tokens, ``<|endoftext|>``, then padding
with the pad token the folder names (``<|endoftext|>`` in SD-1.x, ``!`` in SD-2.x and SDXL).
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from layers.files import JSON_LIMIT, inside, read_bounded, read_json
from tensorcore.atomic import write_atomic

from .clip_bpe import BytePairEncoder, normalize, words
from .special_tokens import special_tokens

VOCAB_NAME, MERGES_NAME, TOKENIZER_NAME = "vocab.json", "merges.txt", "tokenizer.json"
CONFIG_NAME, SPECIAL_MAP_NAME = "tokenizer_config.json", "special_tokens_map.json"
PADDING = {False: None, "do_not_pad": None, True: "longest", "longest": "longest", "max_length": "max_length"}
OWNER = "CLIPTokenizer.from_pretrained"
TRUNCATION = {None: None, False: False, "do_not_truncate": False, True: True, "longest_first": True, "only_first": True}


class BatchEncoding(Mapping[str, Any]):
    """``input_ids`` and ``attention_mask``, as attributes or keys (transformers' ``BatchEncoding``)."""

    def __init__(self, input_ids: Any, attention_mask: Any) -> None:
        self.input_ids, self.attention_mask = input_ids, attention_mask

    def __getitem__(self, key: str) -> Any:
        if key not in ("input_ids", "attention_mask"):
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(("input_ids", "attention_mask"))

    def __len__(self) -> int:
        return 2

    def __repr__(self) -> str:
        return f"BatchEncoding(input_ids={self.input_ids!r}, attention_mask={self.attention_mask!r})"


class CLIPTokenizer:
    """``tokenizer(text_or_texts, padding=False, truncation=None, max_length=None, return_tensors=None)``.

    ``padding``: False, True / "longest" (to the batch's longest) or "max_length";
    ``truncation``: True cuts each sequence to ``max_length`` tokens, end token included
    (None: only when ``max_length`` is given without padding, as transformers does);
    ``max_length`` defaults to ``model_max_length``; ``return_tensors="np"`` gives int64
    arrays [B, L] (a single text too), None gives lists (a single text: one list).
    """

    def __init__(self, vocab: Mapping[str, int], merges: Sequence[tuple[str, str]],
                 tokenizer_config: Mapping[str, Any] | None = None,
                 special_tokens_map: Mapping[str, Any] | None = None, added_tokens: Mapping[str, Any] | None = None
                 ) -> None:
        self.vocab = dict(vocab)
        self.merges = [tuple(pair) for pair in merges]
        self.tokenizer_config = dict(tokenizer_config or {})
        self.special_tokens_map = dict(special_tokens_map or {})
        # content -> whether the token is matched in the normalised text (else in the raw text)
        named, self.normalized, ids = special_tokens(self.tokenizer_config, self.special_tokens_map, added_tokens)
        self.special_ids = {}
        for content in self.normalized:  # tokens the vocabulary lacks get the next free ids, as transformers adds them
            next_free = len(self.vocab) + len(self.special_ids)
            self.special_ids[content] = ids.get(content, self.vocab.get(content, next_free))
        self.bos_token, self.eos_token = named["bos_token"], named["eos_token"]
        self.pad_token, self.unk_token = named["pad_token"], named["unk_token"]
        self.bos_token_id, self.eos_token_id = self.special_ids[self.bos_token], self.special_ids[self.eos_token]
        self.pad_token_id, self.unk_token_id = self.special_ids[self.pad_token], self.special_ids[self.unk_token]
        limit = self.tokenizer_config.get("model_max_length")
        self.model_max_length: int | None = limit if isinstance(limit, int) and 0 < limit < 2 ** 31 else None
        self._raw = _matcher([c for c, n in self.normalized.items() if not n])
        self._normalized = {normalize(c): self.special_ids[c] for c, n in self.normalized.items() if n}
        self._after_normalizing = _matcher(list(self._normalized))
        self.bpe = BytePairEncoder(self.merges)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> CLIPTokenizer:
        """The tokenizer stored in a transformers tokenizer folder (``tokenizer.json`` first, as transformers does)."""
        folder = Path(path)
        if (folder / TOKENIZER_NAME).exists():
            vocab, merges, added = _read_tokenizer_json(folder / TOKENIZER_NAME)
        else:
            vocab, merges, added = _read_json(folder / VOCAB_NAME), _read_merges(folder / MERGES_NAME), None
        if not isinstance(vocab, dict) or not all(isinstance(v, int) for v in vocab.values()):
            raise ValueError(f"{OWNER}: the vocabulary in {str(folder)!r} must map tokens to int ids")
        config = _read_json(folder / CONFIG_NAME) if (folder / CONFIG_NAME).exists() else {}
        special_map = _read_json(folder / SPECIAL_MAP_NAME) if (folder / SPECIAL_MAP_NAME).exists() else {}
        if not isinstance(config, dict) or not isinstance(special_map, dict):
            raise ValueError(f"{OWNER}: {CONFIG_NAME} and {SPECIAL_MAP_NAME} must hold JSON objects")
        return cls(vocab, merges, config, special_map, added)

    def save_pretrained(self, path: str | os.PathLike) -> None:
        """Write vocab.json, merges.txt, tokenizer_config.json and special_tokens_map.json into the
        folder ``path`` (created if needed), each atomically; the config lists every special
        token with its id and flags (``added_tokens_decoder``), so transformers reads them back alike."""
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        decoder = {str(self.special_ids[c]): {"content": c, "lstrip": False, "normalized": n, "rstrip": False,
                                              "single_word": False, "special": True}
                   for c, n in self.normalized.items()}
        config = {**self.tokenizer_config, "added_tokens_decoder": decoder, "tokenizer_class": "CLIPTokenizer"}
        if self.model_max_length is not None:
            config["model_max_length"] = self.model_max_length
        merges = "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in self.merges)
        write_atomic(folder / VOCAB_NAME, json.dumps(self.vocab, ensure_ascii=False).encode())
        write_atomic(folder / MERGES_NAME, merges.encode())
        write_atomic(folder / SPECIAL_MAP_NAME, (json.dumps(self.special_tokens_map, indent=2) + "\n").encode())
        write_atomic(folder / CONFIG_NAME, (json.dumps(config, indent=2) + "\n").encode())

    def tokenize(self, text: str) -> list[str]:
        """The tokens of ``text`` (BPE symbols and special tokens), without the start and end tokens."""
        return [self.tokens[i] for i in self.encode(text)]

    @functools.cached_property
    def tokens(self) -> dict[int, str]:
        """id -> token, special tokens included."""
        return {i: t for t, i in self.vocab.items()} | {i: c for c, i in self.special_ids.items()}

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``'s tokens, without the start and end tokens."""
        if not isinstance(text, str):
            raise TypeError(f"CLIPTokenizer: a text must be a str, got {type(text).__name__}")
        ids: list[int] = []
        for piece, raw_special in _split(text, self._raw):
            if raw_special:
                ids.append(self.special_ids[piece])
                continue
            for part, special in _split(normalize(piece), self._after_normalizing):
                if special:
                    ids.append(self._normalized[part])
                    continue
                for word in words(part):
                    ids.extend(self.vocab.get(symbol, self.unk_token_id) for symbol in self.bpe(word))
        return ids

    def __call__(self, text: str | Sequence[str], padding: bool | str = False, truncation: bool | str | None = None,
                 max_length: int | None = None, return_tensors: str | None = None) -> BatchEncoding:
        single = isinstance(text, str)
        texts = [text] if single else list(text)
        if padding not in PADDING:
            raise ValueError(f"CLIPTokenizer: padding must be one of {list(PADDING)}, got {padding!r}")
        if truncation not in TRUNCATION:
            raise ValueError(f"CLIPTokenizer: truncation must be one of {list(TRUNCATION)}, got {truncation!r}")
        if return_tensors not in (None, "np"):
            raise ValueError(f"CLIPTokenizer: return_tensors must be None or 'np', got {return_tensors!r}")
        bad_length = not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 2
        if max_length is not None and bad_length:
            raise ValueError(f"CLIPTokenizer: max_length must be an int >= 2 (room for the start and end tokens), "
                             f"got {max_length!r}")
        pad = PADDING[padding]
        truncate = TRUNCATION[truncation]
        if truncate is None:  # transformers truncates when a max_length comes without padding
            truncate = max_length is not None and pad is None
        limit = max_length if max_length is not None else self.model_max_length
        if limit is None and (truncate or pad == "max_length"):
            raise ValueError("CLIPTokenizer: truncation and padding='max_length' need max_length "
                             "(this tokenizer's config gives no model_max_length)")
        body = [self.encode(t) for t in texts]
        if truncate:
            body = [ids[:limit - 2] for ids in body]
        sequences = [[self.bos_token_id, *ids, self.eos_token_id] for ids in body]
        width = max(map(len, sequences), default=0) if pad == "longest" else limit if pad == "max_length" else 0
        masks = [[1] * len(s) + [0] * max(width - len(s), 0) for s in sequences]
        sequences = [s + [self.pad_token_id] * max(width - len(s), 0) for s in sequences]
        if return_tensors == "np":
            if len({len(s) for s in sequences}) > 1:
                raise ValueError("CLIPTokenizer: return_tensors='np' needs sequences of one length; "
                                 "pass padding=True or padding='max_length'")
            return BatchEncoding(np.array(sequences, dtype=np.int64).reshape(len(texts), -1),
                                 np.array(masks, dtype=np.int64).reshape(len(texts), -1))
        return BatchEncoding(sequences[0], masks[0]) if single else BatchEncoding(sequences, masks)

    @property
    def vocab_size(self) -> int:
        """The BPE vocabulary's size (without added special tokens)."""
        return len(self.vocab)

    def __len__(self) -> int:
        return len(set(self.vocab.values()) | set(self.special_ids.values()))


def _matcher(tokens: list[str]) -> re.Pattern[str] | None:
    """A pattern finding the leftmost, then longest, of ``tokens``; None when there are none."""
    if not tokens:
        return None
    return re.compile("|".join(re.escape(t) for t in sorted(tokens, key=len, reverse=True)))


def _split(text: str, matcher: re.Pattern[str] | None) -> Iterator[tuple[str, bool]]:
    """``text`` cut into (piece, is a special token) around the matches of ``matcher``; empty pieces left out."""
    start = 0
    for match in matcher.finditer(text) if matcher is not None else ():
        if match.start() > start:
            yield text[start:match.start()], False
        yield match.group(), True
        start = match.end()
    if start < len(text):
        yield text[start:], False


def _read_json(path: Path) -> Any:
    """The JSON value in ``path``, read only as a regular file inside its folder, within ``layers.files``' caps."""
    if not (path.exists() or path.is_symlink()):
        raise FileNotFoundError(f"{OWNER}: no {path.name} in {str(path.parent)!r}")
    return read_json(inside(path.parent, path.name, OWNER), OWNER)


def _read_merges(path: Path) -> list[tuple[str, str]]:
    """The merge pairs of a merges.txt, its ``#version`` line and blank lines skipped."""
    if not (path.exists() or path.is_symlink()):
        raise FileNotFoundError(f"{OWNER}: no {path.name} in {str(path.parent)!r}")
    data = read_bounded(inside(path.parent, path.name, OWNER), OWNER, JSON_LIMIT)
    try:
        lines = data.decode("utf-8").split("\n")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{OWNER}: {str(path)!r} is not UTF-8 text ({exc})") from exc
    merges = []
    for number, line in enumerate(lines, 1):
        if not line.strip() or (number == 1 and line.startswith("#version")):
            continue
        pair = line.split()
        if len(pair) != 2:
            raise ValueError(f"{OWNER}: {str(path)!r} line {number} is not a merge pair: {line!r}")
        merges.append((pair[0], pair[1]))
    return merges


def _read_tokenizer_json(path: Path) -> tuple[Any, list[tuple[str, str]], dict[str, Any]]:
    """(vocab, merges, id -> added token) of a tokenizers BPE file with ``</w>`` word ends."""
    data = _read_json(path)
    model = data.get("model") if isinstance(data, dict) else None
    if not isinstance(model, dict) or model.get("type") != "BPE" or model.get("end_of_word_suffix") != "</w>":
        raise ValueError(f"{OWNER}: {str(path)!r} does not hold a BPE model with '</w>' word ends")
    merges = []
    for merge in model.get("merges") or []:
        pair = merge.split() if isinstance(merge, str) else merge
        if not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(p, str) for p in pair):
            raise ValueError(f"{OWNER}: {str(path)!r} holds a merge that is not a pair: {merge!r}")
        merges.append((pair[0], pair[1]))
    added = {}
    for token in data.get("added_tokens") or []:
        if not isinstance(token, dict) or not isinstance(token.get("id"), int):
            raise ValueError(f"{OWNER}: {str(path)!r} holds an added token without an id: {token!r}")
        added[str(token["id"])] = {k: v for k, v in token.items() if k != "id"}
    return model.get("vocab"), merges, added
