"""Scatter-add (``dst[index] += values`` with repeated indices accumulated) for NumPy
and CuPy.

NumPy spells it ``numpy.add.at``; CuPy's ufuncs have no ``at`` and use
``cupyx.scatter_add`` instead.  This is the one place that tells them apart.
"""

from __future__ import annotations

from typing import Any

Array = Any


def scatter_add(xp: Any, dst: Array, index: Any, values: Array) -> None:
    """In place: ``dst[index] += values``, accumulating where ``index`` repeats."""
    if xp.__name__ == "cupy":
        import cupyx

        cupyx.scatter_add(dst, index, values)
    else:
        xp.add.at(dst, index, values)
