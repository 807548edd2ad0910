"""Checked number types for the command line, and a parser that reports an error in one line.

    parser = cli_args.ArgumentParser(prog="python -m diffusion")
    parser.add_argument("--lr", type=cli_args.positive_float, default=0.1)

A bad value exits with status 2 and one line on stderr naming the option and what it
expects: ``python -m diffusion demo: error: argument --lr: expected a number > 0, got '-1'``.
"""

from __future__ import annotations

import argparse
import math
from typing import Callable, NoReturn


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, reporting an error as one line (``prog: error: message``) and
    exiting with status 2; ``--help`` still prints the full usage.  Subcommand parsers
    made with ``add_subparsers`` are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _checked(convert: Callable[[str], float], test: Callable[[float], bool], expected: str,
             name: str) -> Callable[[str], float]:
    """An argparse ``type``: ``convert`` the text, then require ``test`` to hold."""
    def parse(text: str) -> float:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not test(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value
    parse.__name__ = name  # argparse names the type in some messages
    return parse


positive_int = _checked(int, lambda v: v > 0, "an integer > 0", "positive_int")
non_negative_int = _checked(int, lambda v: v >= 0, "an integer >= 0", "non_negative_int")
positive_float = _checked(float, lambda v: math.isfinite(v) and v > 0, "a number > 0", "positive_float")
non_negative_float = _checked(float, lambda v: math.isfinite(v) and v >= 0, "a number >= 0", "non_negative_float")
probability = _checked(float, lambda v: 0 <= v <= 1, "a probability in [0, 1]", "probability")

