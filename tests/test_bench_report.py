"""The benchmarks' shared table printer: aligned text by default, Markdown under a run
line with ``--markdown``."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "benchmarks"))
import bench_report  # noqa: E402


def test_markdown_prints_the_run_line_then_each_table_and_note(monkeypatch, capsys):
    monkeypatch.setattr(bench_report, "markdown", False)  # set back after the test
    assert bench_report.parse("a benchmark", ["--markdown"]).markdown
    table = bench_report.Table("Title", ["case", "ms"])
    table.row("a | b <c>", "1.50")
    bench_report.note("one figure: 2 ms")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Run ") and " UTC, commit " in lines[0] and lines[0].endswith("`")
    assert lines[1:] == ["", "Title", "", "| case | ms |", "|:---|---:|", "| a \\| b &lt;c> | 1.50 |", "",
                         "one figure: 2 ms"]


def test_text_rows_are_aligned_under_their_columns(monkeypatch, capsys):
    monkeypatch.setattr(bench_report, "markdown", False)
    table = bench_report.Table("Title", ["case", "ms"], first=8)
    table.row("conv", "12.5")
    assert capsys.readouterr().out.splitlines() == ["", "Title", "case            ms", "conv          12.5"]


def test_the_run_line_names_the_commit_machine_and_command(monkeypatch):
    monkeypatch.setenv("TENSORCORE_BACKEND", "numba")
    line = bench_report.run_line()
    assert bench_report.commit() in line and bench_report.machine() in line
    assert "TENSORCORE_BACKEND=numba " in line
