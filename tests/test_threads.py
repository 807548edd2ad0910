"""CPU thread coordination (``tc.set_num_threads``), each case in a fresh subprocess.

Thread pools and the environment variables that size them are fixed when a library
loads, so what matters is what a new process does: these tests run small scripts in
subprocesses (with ``NUMBA_NUM_THREADS=2``, so the pool has two threads on any machine)
and check what they report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Runs after the scenario's imports: exercises kernels and threaded products and reports.
REPORT = """
import json, sys, threading
import numpy as np
import numba
import tensorcore as tc
from threadpoolctl import threadpool_info
from tensorcore.backends.numba import threads

def blas_threads():
    return sorted({lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"})

def products_ok():
    rng = np.random.default_rng(0)
    ok = True
    for dtype, tol in ((np.float32, 1e-4), (np.float64, 1e-12)):
        a = rng.standard_normal((300, 400)).astype(dtype)
        b = rng.standard_normal((400, 500)).astype(dtype)
        ref = a.astype(np.float64) @ b.astype(np.float64)
        ok &= bool(np.abs(a @ b - ref).max() <= tol * np.abs(ref).max())
    return ok

def step():
    x = tc.randn(64, 1, 8, 8)
    w = tc.randn(32, 1, 3, 3, requires_grad=True)
    y = tc.functional.conv2d(x, w, padding=1).relu().sum()
    y.backward()
    return bool(np.isfinite(w.grad.numpy()).all())

tc.get_backend()
report = {"default": tc.get_num_threads(), "layer": numba.threading_layer(),
          "info": {k: v for k, v in threads.thread_info().items() if k != "blas"},
          "blas_default": blas_threads(), "products_ok": products_ok(), "step_ok": step(),
          "spin_env_left": "GOMP_SPINCOUNT" in __import__("os").environ}
tc.set_num_threads(1)
report["after_1"] = [tc.get_num_threads(), blas_threads(), products_ok(), step()]
seen = []

def other_thread():
    tc.randn(300_000).relu()  # a kernel large enough to run in parallel
    seen.extend([tc.get_num_threads(), numba.get_num_threads()])

t = threading.Thread(target=other_thread)
t.start(); t.join()
report["other_thread_sees"] = seen
tc.set_num_threads(64)
report["after_64"] = [tc.get_num_threads(), blas_threads(), products_ok(), step()]
if "torch" in sys.modules:
    import torch
    report["torch_threads"] = [globals()["TORCH_BEFORE"], torch.get_num_threads()]
print("REPORT " + json.dumps(report))
"""


def run_script(code: str, env: dict[str, str] | None = None) -> dict:
    """Run ``code`` in a fresh interpreter (this checkout first on the path); returns
    the JSON it prints on its ``REPORT`` line."""
    full_env = {**os.environ, "NUMBA_NUM_THREADS": "2", **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join([str(ROOT), full_env.get("PYTHONPATH", "")])
    full_env.pop("TENSORCORE_BACKEND", None)
    full_env.pop("GOMP_SPINCOUNT", None)  # tensorcore's own default is under test
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("REPORT ")][-1]
    return json.loads(line[len("REPORT "):])


def check_report(report: dict) -> None:
    assert report["default"] == 2
    assert report["layer"] == "omp"
    assert report["info"]["blas_on_numba_pool"] is True
    assert report["blas_default"] == [2]  # OpenBLAS's jobs run on Numba's 2 threads
    assert report["products_ok"] and report["step_ok"]
    assert report["spin_env_left"] is False  # the spin setting never leaks to other libraries
    assert report["after_1"] == [1, [1], True, True]
    assert report["other_thread_sees"] == [1, 1]  # process-wide, as torch's setting
    assert report["after_64"] == [2, [2], True, True]  # capped at Numba's pool


def test_defaults_and_set_num_threads_numpy_first():
    check_report(run_script("import numpy\n" + REPORT))


@pytest.mark.parametrize("order", ["torch first", "torch after"])
def test_settings_apply_with_torch_imported(order):
    pytest.importorskip("torch")
    if order == "torch first":
        prefix = "import torch\nTORCH_BEFORE = torch.get_num_threads()\n"
    else:  # tensorcore's pools exist before torch loads its OpenMP runtime and runs on it
        prefix = ("import tensorcore as tc\ntc.get_num_threads()\nimport torch\n"
                  "TORCH_BEFORE = torch.get_num_threads()\ntorch.ones(300, 300) @ torch.ones(300, 300)\n")
    report = run_script(prefix + REPORT)
    check_report(report)
    before, after = report["torch_threads"]
    assert after == before  # torch's own setting is left alone


def test_blas_limit_from_environment_is_kept_until_set():
    report = run_script(REPORT, {"OPENBLAS_NUM_THREADS": "1"})
    assert report["default"] == 2 and report["blas_default"] == [1]
    assert report["after_64"][:2] == [2, [2]]  # an explicit call wins over the environment


def test_concurrent_products_and_fork():
    report = run_script("""
        import json, os, threading
        import numpy as np
        import tensorcore as tc
        tc.get_backend()
        rng = np.random.default_rng(1)
        a = rng.standard_normal((256, 384)).astype(np.float32)
        b = rng.standard_normal((384, 320)).astype(np.float32)
        ref = a.astype(np.float64) @ b
        errors = []
        def work():
            for _ in range(20):
                errors.append(float(np.abs(a @ b - ref).max()))
        workers = [threading.Thread(target=work) for _ in range(3)]
        [w.start() for w in workers]; [w.join() for w in workers]
        pid = os.fork()
        if pid == 0:  # GNU OpenMP does not survive fork: the child's products use OpenBLAS's threads
            os._exit(0 if np.abs(a @ b - ref).max() < 1e-3 else 1)
        _, status = os.waitpid(pid, 0)
        print("REPORT " + json.dumps({"max_error": max(errors), "child_status": status}))
    """)
    assert report["max_error"] < 1e-3
    assert report["child_status"] == 0


def test_small_kernels_run_serially():
    report = run_script("""
        import json
        import numpy as np
        import numba
        import tensorcore as tc
        from tensorcore.backends.numba import threads
        from tensorcore.backends.numba.kernels import activations as K
        tc.get_backend()
        counts = {}
        for n in (100, threads.SERIAL_BELOW):
            x = np.ones(n, np.float32)
            out = K.act_forward_flat(x, K.ACT_CODES["relu"])
            counts[n] = [numba.get_num_threads(), float(out.sum())]
        print("REPORT " + json.dumps({"counts": counts, "below": threads.SERIAL_BELOW}))
    """)
    below = report["below"]
    assert report["counts"]["100"] == [1, 100.0]
    assert report["counts"][str(below)] == [2, float(below)]


def test_set_num_threads_validates():
    report = run_script("""
        import json
        import tensorcore as tc
        before = tc.get_num_threads()
        caught = {}
        for bad in (0, -3, 2.5, True, "2", None):
            try:
                tc.set_num_threads(bad)
            except (TypeError, ValueError) as exc:
                caught[repr(bad)] = [type(exc).__name__, str(exc)]
        unchanged = tc.get_num_threads() == before
        import numpy as np
        tc.set_num_threads(np.int64(1))  # NumPy integers are accepted
        print("REPORT " + json.dumps({"caught": caught, "unchanged": unchanged, "numpy_int": tc.get_num_threads()}))
    """)
    expected = {"0": "ValueError", "-3": "ValueError", "2.5": "TypeError", "True": "TypeError",
                "'2'": "TypeError", "None": "TypeError"}
    assert {k: v[0] for k, v in report["caught"].items()} == expected
    for value, (_, message) in report["caught"].items():
        assert "set_num_threads" in message and value in message
    assert report["unchanged"] and report["numpy_int"] == 1
