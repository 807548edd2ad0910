"""Which special tokens a tokenizer folder names, and whether each is matched before or after normalisation.

transformers reads them from ``tokenizer_config.json``: its ``added_tokens_decoder`` when
present; otherwise the named tokens, ``special_tokens_map.json`` taking precedence, and
the ``added_tokens`` of ``tokenizer.json`` when there is one.  It registers the named ones
in the order of ``KEYS``; a named token that is also an added token keeps the added
token's flags, and one registered twice keeps the flags of its last registration.

A token written as a plain string is matched in the raw text; one written as an object
with ``"normalized": true`` is matched in the lower-cased, normalised text (so
``<|ENDOFTEXT|>`` matches it too).
"""

from __future__ import annotations

from typing import Any, Mapping

KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
EXTRA_KEYS = ("extra_special_tokens", "additional_special_tokens")
CLIP_DEFAULTS = {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
                 "pad_token": "<|endoftext|>"}


def _token(value: Any, where: str) -> tuple[str, bool]:
    """(content, normalized) of a token written as a string or an AddedToken object."""
    if isinstance(value, str):
        return value, False
    if not isinstance(value, Mapping) or not isinstance(value.get("content"), str):
        raise ValueError(f"CLIPTokenizer: {where} must be a string or an object with a string 'content', got {value!r}")
    for flag in ("lstrip", "rstrip", "single_word"):
        if value.get(flag):
            raise ValueError(f"CLIPTokenizer: {where} {value['content']!r} sets {flag}, "
                             "which this tokenizer does not support")
    return value["content"], bool(value.get("normalized", False))


def special_tokens(config: Mapping[str, Any], special_map: Mapping[str, Any], added: Mapping[str, Any] | None = None
                   ) -> tuple[dict[str, str], dict[str, bool], dict[str, int]]:
    """``(named, normalized, ids)``: key -> content of the named tokens (CLIP's defaults for the
    ones left out), content -> matched after normalisation, and the ids of the added tokens
    (``added``: id -> token, from tokenizer.json)."""
    decoder = config.get("added_tokens_decoder")
    sources: Mapping[str, Any] = config if decoder is not None else {**config, **special_map}
    decoder = decoder if decoder is not None else added or {}
    if not isinstance(decoder, Mapping):
        raise ValueError(f"CLIPTokenizer: added_tokens_decoder must be an object of id -> token, got {decoder!r}")
    normalized: dict[str, bool] = {}
    ids: dict[str, int] = {}
    for key, value in decoder.items():
        content, normalized[content] = _token(value, f"added token {key!r}")
        try:
            ids[content] = int(key)
        except ValueError:
            raise ValueError(f"CLIPTokenizer: added token id {key!r} is not an int") from None
    named: dict[str, str] = {}
    for key in KEYS:
        value = sources.get(key, CLIP_DEFAULTS.get(key))
        if value is not None:
            content, flag = _token(value, key)
            named[key] = content
            normalized[content] = normalized[content] if content in ids else flag
    for key in EXTRA_KEYS:
        for value in sources.get(key) or ():
            content, flag = _token(value, key)
            normalized[content] = normalized[content] if content in ids else flag
    return named, normalized, ids
