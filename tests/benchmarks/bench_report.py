"""The tables the benchmark scripts print: aligned text, or with ``--markdown`` Markdown
tables under one line naming the run (date, commit, machine, the exact command), ready
for docs/benchmarks.md.

A script parses its command line with ``parse`` (which adds ``--markdown``), makes a
``Table`` per table it prints and adds rows as they are measured; lines that are not
table rows go through ``note``.  Everything is printed as soon as it is known, so a run
cut short by a time limit keeps what it measured.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[2]
markdown = False  # set by parse from --markdown


def parse(parser: argparse.ArgumentParser | str, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line (``argv``, else the process's) with the script's ``parser``
    (or a parser with no options of its own, described by the given text) plus
    ``--markdown``; with it, print the run line."""
    global markdown
    if isinstance(parser, str):
        parser = argparse.ArgumentParser(description=parser, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--markdown", action="store_true",
                        help="print the tables as Markdown under a line naming the date, commit, machine and command")
    args = parser.parse_args(argv)
    markdown = args.markdown
    if markdown:
        print(run_line(), flush=True)
    return args


def run_line() -> str:
    """The line heading a run's tables: date, commit, machine and the exact command."""
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"Run {date}, commit {commit()}, {machine()}: `{command()}`"


def commit() -> str:
    """The checkout's short commit hash, or "unknown"."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def machine() -> str:
    """The GPU's name (through CuPy, else PyTorch) where there is one, else the CPU model
    and its core count."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    except Exception:  # no CuPy, or no device it can reach
        pass
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return f"{cpu_model()}, {os.cpu_count()} cores"


def cpu_model() -> str:
    """The CPU's model name as the kernel reports it, else the platform's word for it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def command() -> str:
    """The command line as run: the TENSORCORE_* settings in the environment, then the
    interpreter and its arguments."""
    settings = [f"{k}={shlex.quote(v)}" for k, v in sorted(os.environ.items()) if k.startswith("TENSORCORE_")]
    return " ".join(settings + [shlex.quote(a) for a in getattr(sys, "orig_argv", [sys.executable, *sys.argv])])


class Table:
    """One table, printed row by row: a title, then the column names, then each row."""

    def __init__(self, title: str, columns: Sequence[str], first: int = 0) -> None:
        """``first``: the width of the first (left-aligned) column in text mode; the
        other columns are right-aligned, each as wide as its name and at least 9."""
        self.widths = [max(len(columns[0]), first)] + [max(len(c), 9) for c in columns[1:]]
        if markdown:
            print(f"\n{title}\n\n| " + " | ".join(_cell(c) for c in columns) + " |")
            print("|" + "|".join([":---"] + ["---:"] * (len(columns) - 1)) + "|", flush=True)
        else:
            print(f"\n{title}\n{self._text(columns)}", flush=True)

    def row(self, *cells: object) -> None:
        if markdown:
            print("| " + " | ".join(_cell(c) for c in cells) + " |", flush=True)
        else:
            print(self._text(cells), flush=True)

    def _text(self, cells: Sequence[object]) -> str:
        first, *rest = [str(c) for c in cells]
        return " ".join([first.ljust(self.widths[0])] + [c.rjust(w) for c, w in zip(rest, self.widths[1:])])


def note(text: str) -> None:
    """A line beside the tables (a single figure, a setting of the run); in Markdown a
    paragraph of its own."""
    print(f"\n{text}" if markdown else text, flush=True)


def _cell(value: object) -> str:
    """A value as Markdown table cell text: its bars escaped, no angle bracket read as HTML."""
    return str(value).replace("|", "\\|").replace("<", "&lt;")
