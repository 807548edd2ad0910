"""The command line checks its numbers: a bad value exits non-zero with one line naming
the option, before any work starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from diffusion.cli import args as cli_args

REPO = Path(__file__).resolve().parents[1]


def _parser() -> cli_args.OneLineParser:
    parser = cli_args.OneLineParser(prog="tool")
    sub = parser.add_subparsers(dest="command", required=True).add_parser("run")
    for option, kind in [("--steps", cli_args.positive_int), ("--workers", cli_args.non_negative_int),
                         ("--lr", cli_args.positive_float), ("--decay", cli_args.non_negative_float),
                         ("--p", cli_args.probability)]:
        sub.add_argument(option, type=kind)
    return parser


@pytest.mark.parametrize("option, good, value", [
    ("--steps", "3", 3), ("--workers", "0", 0), ("--lr", "1e-3", 1e-3), ("--decay", "0", 0.0),
    ("--p", "0.5", 0.5), ("--p", "0", 0.0),
])
def test_good_values_parse(option, good, value):
    args = _parser().parse_args(["run", option, good])
    assert getattr(args, option.lstrip("-")) == value


@pytest.mark.parametrize("option, bad", [
    ("--steps", "0"), ("--steps", "-5"), ("--steps", "2.5"), ("--steps", "many"), ("--workers", "-1"),
    ("--lr", "-1"), ("--lr", "0"), ("--lr", "nan"), ("--lr", "inf"), ("--decay", "-0.1"),
    ("--p", "1"), ("--p", "1.5"), ("--p", "-0.1"), ("--p", "nan"),
])
def test_bad_values_exit_with_one_line_naming_the_option(option, bad, capsys):
    with pytest.raises(SystemExit) as info:
        _parser().parse_args(["run", option, bad])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tool run: error: ")
    assert f"argument {option}:" in err and repr(bad) in err


@pytest.mark.parametrize("option, bad", [("--lr", "-1"), ("--batch-size", "0"), ("--steps", "-5"), ("--seed", "-1"), ("--ema-decay", "2")])
def test_the_train_command_rejects_bad_numbers(option, bad):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, "-m", "diffusion", "train", option, bad], env=env, cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stdout == ""  # nothing was trained
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and f"argument {option}:" in lines[0], result.stderr
