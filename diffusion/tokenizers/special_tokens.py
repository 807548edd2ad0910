"""Which special tokens a tokenizer folder names, and whether each is matched before or after normalisation.

transformers reads them from ``tokenizer_config.json`` (its ``added_tokens_decoder`` when
present; otherwise the named tokens, with ``special_tokens_map.json`` taking precedence)
and registers the named ones in the order of ``KEYS``; a token registered twice keeps the
flags of its last registration.  A token written as a plain string is matched in the raw
text; one written as an object with ``"normalized": true`` is matched in the lower-cased,
normalised text (so ``<|ENDOFTEXT|>`` matches it too).
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
            raise ValueError(f"CLIPTokenizer: {where} {value['content']!r} sets {flag}, which this tokenizer does not support")
    return value["content"], bool(value.get("normalized", False))


def special_tokens(config: Mapping[str, Any], special_map: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, bool], dict[str, int]]:
    """``(named, normalized, ids)``: key -> content of the named tokens (CLIP's defaults for the
    ones left out), content -> matched after normalisation, and the ids ``added_tokens_decoder`` gives."""
    decoder = config.get("added_tokens_decoder")
    normalized: dict[str, bool] = {}
    ids: dict[str, int] = {}
    if decoder is not None:
        if not isinstance(decoder, Mapping):
            raise ValueError(f"CLIPTokenizer: added_tokens_decoder must be an object of id -> token, got {decoder!r}")
        for key, value in decoder.items():
            content, normalized[content] = _token(value, f"added_tokens_decoder[{key!r}]")
            try:
                ids[content] = int(key)
            except ValueError:
                raise ValueError(f"CLIPTokenizer: added_tokens_decoder key {key!r} is not an id") from None
        sources: Mapping[str, Any] = config
    else:
        sources = {**config, **special_map}
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
