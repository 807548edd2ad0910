"""CLIP's byte-level BPE: text -> BPE token strings, as transformers' ``CLIPTokenizer`` splits it.

Three steps, each as transformers (its ``tokenizers`` pipeline) does them:

1. normalise: Unicode NFC, then lower-case character by character;
2. pre-tokenise into words: CLIP's pattern ``'s|'t|'re|'ve|'m|'ll|'d|\\p{L}+|\\p{N}|[^\\s\\p{L}\\p{N}]+``,
   whitespace dropped.  ``\\p{L}``, ``\\p{N}`` are the Unicode letter and number categories
   (read with ``unicodedata``), ``\\s`` the Unicode White_Space characters;
3. byte-level BPE: each word's UTF-8 bytes as printable characters (GPT-2's
   ``bytes_to_unicode``), ``</w>`` appended to the last, then merged pair by pair, the
   lowest-ranked pair of ``merges.txt`` first.
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache
from typing import Iterator, Sequence

END_OF_WORD = "</w>"
CACHE_WORDS = 65536  # words whose BPE is remembered; the cache starts over when full
CONTRACTIONS = ("re", "ve", "ll", "s", "t", "m", "d")  # after an apostrophe; longer ones tried first
WHITE_SPACE = frozenset("\t\n\v\f\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000"
                        + "".join(map(chr, range(0x2000, 0x200B))))


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """Each byte -> a printable character: printable Latin-1 bytes map to themselves, the
    others to U+0100 onwards in byte order (GPT-2's table, which CLIP's vocabulary is written in)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    for n, b in enumerate(b for b in range(256) if b not in table):
        table[b] = chr(256 + n)
    return dict(sorted(table.items()))


def normalize(text: str) -> str:
    """NFC, then each character lower-cased on its own (no final-sigma rule), as ``tokenizers``' Lowercase."""
    return "".join(c.lower() for c in unicodedata.normalize("NFC", text))


def _kind(c: str) -> str:
    """'s' whitespace, 'L' letter, 'N' number, 'P' anything else."""
    if c in WHITE_SPACE:
        return "s"
    category = unicodedata.category(c)[0]
    return category if category in "LN" else "P"


def words(text: str) -> Iterator[str]:
    """The pre-tokenised words of normalised ``text`` (step 2)."""
    i, n = 0, len(text)
    while i < n:
        kind = _kind(text[i])
        if kind == "s":
            i += 1
            continue
        if text[i] == "'":
            contraction = next((c for c in CONTRACTIONS if text.startswith(c, i + 1)), None)
            if contraction is not None:
                yield text[i:i + 1 + len(contraction)]
                i += 1 + len(contraction)
                continue
        end = i + 1
        if kind != "N":  # a number is one digit; letters and other characters run on
            while end < n and _kind(text[end]) == kind:
                end += 1
        yield text[i:end]
        i = end


class BytePairEncoder:
    """BPE over the merge ranks of ``merges`` (pairs of symbols, most frequent first), with a cache per word."""

    def __init__(self, merges: Sequence[tuple[str, str]]) -> None:
        self.ranks = {pair: rank for rank, pair in enumerate(merges)}
        self.byte_chars = bytes_to_unicode()
        self.cache: dict[str, list[str]] = {}

    def __call__(self, word: str) -> list[str]:
        """The BPE symbols of one pre-tokenised word."""
        if word not in self.cache:
            if len(self.cache) >= CACHE_WORDS:
                self.cache.clear()
            chars = [self.byte_chars[b] for b in word.encode("utf-8")]
            self.cache[word] = self._merge(chars[:-1] + [chars[-1] + END_OF_WORD])
        return self.cache[word]

    def _merge(self, symbols: list[str]) -> list[str]:
        """Merge the lowest-ranked adjacent pair everywhere it occurs, left to right, until none is ranked."""
        while len(symbols) > 1:
            pairs = {(a, b) for a, b in zip(symbols, symbols[1:])}
            best = min(pairs, key=lambda p: self.ranks.get(p, len(self.ranks)))
            if best not in self.ranks:
                break
            merged, i = [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                    merged.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = merged
        return symbols
