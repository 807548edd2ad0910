"""Tokenizers read from transformers' tokenizer folders, giving transformers' ids.

    from diffusion import CLIPTokenizer
    tokenizer = CLIPTokenizer.from_pretrained("sd-1.5/tokenizer")
"""

from .clip_tokenizer import BatchEncoding, CLIPTokenizer

__all__ = ["CLIPTokenizer", "BatchEncoding"]
