"""Scatter-add (``dst[index] += values`` with repeated indices accumulated) for NumPy
and CuPy.

NumPy and CuPy 13+ spell it ``add.at``; older CuPy only has ``cupyx.scatter_add``
(deprecated since).  This is the one place that tells them apart.
"""

from __future__ import annotations

from typing import Any

Array = Any


def scatter_add(xp: Any, dst: Array, index: Any, values: Array) -> None:
    """In place: ``dst[index] += values``, accumulating where ``index`` repeats."""
    add_at = getattr(xp.add, "at", None)
    if add_at is not None:
        add_at(dst, index, values)
        return
    import cupyx

    cupyx.scatter_add(dst, index, values)
