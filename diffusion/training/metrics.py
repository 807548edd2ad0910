"""The metrics CSV of a training run: one row every ``log_every`` steps.

Columns: ``step``, ``loss`` (the mean over the steps since the previous row), ``lr``,
``grad_norm`` (before clipping, at the row's step) and ``seconds`` (training wall time,
counted across resumed parts).  A resumed run first drops the rows past the
checkpoint it resumes from, so the file reads as if the run had never stopped.
"""

from __future__ import annotations

import csv
import os
from typing import Mapping

COLUMNS = ("step", "loss", "lr", "grad_norm", "seconds")


class MetricsLog:
    """Appends rows to ``path``, flushing each so a crash loses nothing written."""

    def __init__(self, path: str | os.PathLike, resume_step: int | None = None,
                 columns: tuple[str, ...] = COLUMNS) -> None:
        self.path, self.columns = os.fspath(path), columns
        kept = []
        if resume_step is not None and os.path.exists(self.path):
            kept = [row for row in read_metrics_rows(self.path) if int(float(row["step"])) <= resume_step]
        with open(self.path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(kept)

    def append(self, row: Mapping[str, float]) -> None:
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, fieldnames=self.columns, extrasaction="ignore").writerow(
                {k: _format(v) for k, v in row.items()})


def _format(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:.6g}"


def read_metrics_rows(path: str | os.PathLike) -> list[dict[str, str]]:
    with open(os.fspath(path), newline="") as f:
        return list(csv.DictReader(f))


def read_metrics(path: str | os.PathLike) -> dict[str, list[float]]:
    """The CSV as columns of floats."""
    rows = read_metrics_rows(path)
    names = rows[0].keys() if rows else COLUMNS
    return {name: [float(row[name]) for row in rows if row.get(name) not in (None, "")] for name in names}
