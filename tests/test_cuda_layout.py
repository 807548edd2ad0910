"""Layout copies on the GPU (``backends/cupy/layout.py``): a batch of transposed matrices
made dense by the tiled transpose equals CuPy's own copy bit for bit, over dtypes,
batch dims and sizes off the 32-element tile; other layouts go to CuPy; the backend's
``copy`` / ``copy_`` and the LayerNorm of a token view ([B, H·W, C] of an NCHW map) take it.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")

import tensorcore as tc  # noqa: E402
import tensorcore.functional as F  # noqa: E402
from tensorcore.backends.cupy import layout  # noqa: E402

DTYPES = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16]


def transposed(rng, batch: tuple[int, ...], rows: int, cols: int, dtype) -> tuple[np.ndarray, object]:
    """(host values [*batch, rows, cols], the device view of [*batch, cols, rows] memory)."""
    memory = rng.standard_normal((*batch, cols, rows)).astype(dtype)
    device = tc.tensor(memory, device="cuda").data
    return memory.swapaxes(-1, -2), device.swapaxes(-1, -2)


@settings(max_examples=30, deadline=None)
@given(batch=st.sampled_from([(), (1,), (3,), (2, 2)]), rows=st.integers(2, 100), cols=st.integers(2, 100),
       dtype=st.sampled_from(DTYPES), seed=st.integers(0, 99))
def test_transposed_batches_copy_exactly(batch, rows, cols, dtype, seed) -> None:
    host, device = transposed(np.random.default_rng(seed), batch, rows, cols, dtype)
    assert layout._transposed_batch(device)
    got = layout.dense_copy(device)
    assert got.flags.c_contiguous and got.shape == host.shape
    np.testing.assert_array_equal(tc.Tensor(got, "cuda").numpy(), host)


def test_other_layouts_go_to_cupy() -> None:
    x = cp.arange(2 * 3 * 4 * 5, dtype=cp.float32).reshape(2, 3, 4, 5)
    for view in (x[:, ::2], x.transpose(0, 2, 1, 3), x[..., 1:]):
        assert not layout._transposed_batch(view)
        np.testing.assert_array_equal(cp.asnumpy(layout.dense_copy(view)), cp.asnumpy(cp.ascontiguousarray(view)))


def test_backend_copies_and_layer_norm_of_a_token_view() -> None:
    rng = np.random.default_rng(5)
    image = rng.standard_normal((2, 64, 12, 10)).astype(np.float16)
    x = tc.tensor(image, device="cuda")
    tokens = x.reshape(2, 64, 120).transpose(1, 2)  # [B, H·W, C], a strided view
    backend = x.backend
    dense = backend.copy(tokens.data)
    np.testing.assert_array_equal(cp.asnumpy(dense), image.reshape(2, 64, 120).swapaxes(1, 2))
    target = cp.empty_like(dense)
    backend.copy_(target, tokens.data)
    np.testing.assert_array_equal(cp.asnumpy(target), cp.asnumpy(dense))
    weight, bias = (tc.tensor(rng.standard_normal(64).astype(np.float16), device="cuda") for _ in range(2))
    got = F.layer_norm(tokens, (64,), weight, bias).numpy()
    want = F.layer_norm(tc.Tensor(dense, "cuda"), (64,), weight, bias).numpy()
    np.testing.assert_array_equal(got, want)
