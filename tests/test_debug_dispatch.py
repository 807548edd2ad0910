"""DEBUG=2 prints, for every backend call, the backend class, the method, the function
the backend's table serves it with and the kernels that ran (``backends/report.py``)."""

import numpy as np
import pytest

import tensorcore as tc
from tensorcore import backends, functional as F, settings
from tensorcore.backends import report

# op -> (protocol method, what serves it on each backend: (table entry, a kernel that ran))
EXPECTED = {
    "numpy": {
        "add": ("binary", "NumpyPrimitives.binary", None),
        "matmul": ("matmul", "computes_in_float32(NumpyPrimitives.matmul)", None),
        "conv2d": ("conv2d", "computes_in_float32(NumpyConvKernels.conv2d)", None),
        "softmax": ("softmax", "computes_in_float32(NumpySoftmaxKernels.softmax)", None),
        "group_norm": ("group_norm", "computes_in_float32(NumpyNormKernels.group_norm)", None),
        "sum": ("reduce", "computes_in_float32(NumpyPrimitives.reduce)", None),
    },
    "numba": {
        "add": ("binary", "NumpyPrimitives.binary", None),
        "matmul": ("matmul", "computes_in_float32(NumpyPrimitives.matmul)", None),
        "conv2d": ("conv2d", "NumbaSpatialKernels.conv2d", "conv"),
        "softmax": ("softmax", "NumbaNNKernels.softmax", "softmax.softmax_rows"),
        "group_norm": ("group_norm", "NumbaNNKernels.group_norm", "norms.group_norm_groups"),
        "sum": ("reduce", "NumbaNNKernels.reduce", "reductions.channel_sums"),
    },
}
CLASSES = {"numpy": "NumpyBackend", "numba": "NumbaBackend", "cupy": "CupyBackend"}


def _run(op: str, x, w):
    return {"add": lambda: x + x, "matmul": lambda: x.reshape(64, 64) @ x.reshape(64, 64),
            "conv2d": lambda: F.conv2d(x, w, padding=1), "softmax": lambda: F.softmax(x, -1),
            "group_norm": lambda: F.group_norm(x, 2), "sum": lambda: x.sum(axis=(0, 2, 3))}[op]()


@pytest.fixture
def debug_2(monkeypatch):
    """DEBUG=2 as the registry sees it when it creates a backend (fresh instances)."""
    monkeypatch.setattr(settings, "debug_level", 2)
    monkeypatch.setattr(report, "active", False)
    monkeypatch.setattr(backends, "_instances", {})


def _lines(name: str, capsys) -> dict[str, str]:
    rng = np.random.default_rng(0)
    device = "cuda" if name == "cupy" else "cpu"
    with tc.use_backend(name):
        x = tc.tensor(rng.standard_normal((2, 8, 16, 16), dtype=np.float32), device=device)
        w = tc.tensor(rng.standard_normal((8, 8, 3, 3), dtype=np.float32), device=device)
        lines = {}
        for op in EXPECTED.get(name, EXPECTED["numba"]):
            capsys.readouterr()
            _run(op, x, w)
            lines[op] = capsys.readouterr().out
    return lines


@pytest.mark.parametrize("name", ["numpy", "numba"])
def test_debug_2_names_backend_method_and_kernel(name, debug_2, capsys):
    lines = _lines(name, capsys)
    for op, (method, served, kernel) in EXPECTED[name].items():
        line = next((ln for ln in lines[op].splitlines() if f"{CLASSES[name]}.{method} ->" in ln), None)
        assert line is not None, (op, lines[op])
        assert f"-> {served}" in line, (op, line)
        if kernel is not None:
            assert "kernels: " in line and kernel in line.split("kernels: ")[1], (op, line)


def test_debug_0_prints_nothing(monkeypatch, capsys):
    monkeypatch.setattr(settings, "debug_level", 0)
    monkeypatch.setattr(backends, "_instances", {})
    with tc.use_backend("numpy"):
        x = tc.ones((2, 3))
        capsys.readouterr()
        (x + x).sum()
    assert capsys.readouterr().out == ""


@pytest.mark.gpu
def test_debug_2_names_the_cuda_kernels(debug_2, capsys):
    lines = _lines("cupy", capsys)
    for op, method, kernel in [("add", "binary", "binary"), ("conv2d", "conv2d", "conv"),
                               ("softmax", "softmax", "softmax"), ("group_norm", "group_norm", ""),
                               ("sum", "reduce", "reduce"), ("matmul", "matmul", "cublasGemm")]:
        line = next((ln for ln in lines[op].splitlines() if f"CupyBackend.{method} ->" in ln), None)
        assert line is not None and "kernels: " in line, (op, lines[op])
        assert kernel in line.split("kernels: ")[1], (op, line)
