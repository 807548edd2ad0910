"""``backends/cupy/pools.py``: the private pools ``tc.cuda``'s counters add, listed while
their owners live (plain objects stand in for CuPy's pools, so this runs without a GPU)."""

from __future__ import annotations

import gc

from tensorcore.backends.cupy import pools


class _Owner:
    pass


def test_a_pool_is_listed_while_its_owner_lives() -> None:
    first, second = _Owner(), _Owner()
    pool_a, pool_b = object(), object()
    before = pools.private_pools()
    pools.register(first, pool_a)
    pools.register(second, pool_b)
    listed = pools.private_pools()
    assert any(p is pool_a for p in listed) and any(p is pool_b for p in listed)
    del first
    gc.collect()
    listed = pools.private_pools()
    assert not any(p is pool_a for p in listed) and any(p is pool_b for p in listed)
    del second
    gc.collect()
    assert len(pools.private_pools()) == len(before)
