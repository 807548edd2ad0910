"""Shared test setup: hypothesis profiles, the ``backend`` fixture, GPU skipping, torch.

* ``CI`` set in the environment selects the ``ci`` hypothesis profile (few examples,
  derandomized so a failure reproduces); otherwise the ``dev`` profile runs.
* ``backend`` runs a test once per available backend, inside ``tc.use_backend(name)``.
* Tests marked ``gpu`` are skipped unless CuPy and a GPU work, ``multigpu`` unless
  there are two GPUs or more.
* Under pytest-xdist, idle OpenMP threads sleep rather than spin (``GOMP_SPINCOUNT=0``),
  and a CLI run compiles its own kernels (``TENSORCORE_COMPILE_PROCESSES=0``).
* The compile cache's signing key lives in the session's temporary directory, not in
  the user's config directory (``TENSORCORE_CACHE_KEY_FILE``; subprocesses inherit it).
"""

from __future__ import annotations

import os
from types import ModuleType

import pytest
from hypothesis import HealthCheck, settings

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Test processes share the cores: OpenMP threads spinning while they wait for work
    # (tensorcore's default for one process) would take them from the others, which
    # made a training test 1.7x slower.  Subprocesses inherit this.
    os.environ.setdefault("GOMP_SPINCOUNT", "0")
    # A CLI run in a test compiles its kernels itself rather than in two more processes
    # (the tests of that path set their own count).
    os.environ.setdefault("TENSORCORE_COMPILE_PROCESSES", "0")

import tensorcore as tc  # noqa: E402
from op_harness import load_torch  # noqa: E402

# The backend fixture only selects a backend, so reusing it across examples is safe.
_SHARED = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
settings.register_profile("ci", max_examples=8, derandomize=True, print_blob=True, **_SHARED)
settings.register_profile("dev", max_examples=25, **_SHARED)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

GPU_COUNT = tc.cuda.device_count()
GPU_AVAILABLE = GPU_COUNT > 0
CPU_BACKENDS = ["numpy", "numba"]
BACKENDS = [pytest.param(name) for name in CPU_BACKENDS] + [pytest.param("cupy", marks=pytest.mark.gpu)]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The name of the backend under test, made the default for the test's duration."""
    with tc.use_backend(request.param):
        yield request.param


@pytest.fixture(scope="session", autouse=True)
def cache_key_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The key file signing the plans the tests cache (made on first use)."""
    path = str(tmp_path_factory.mktemp("config") / "tensorcore" / "cache.key")
    os.environ["TENSORCORE_CACHE_KEY_FILE"] = path
    return path


@pytest.fixture(scope="session")
def torch() -> ModuleType | None:
    """The torch module when it is importable (an extra oracle), else None."""
    return load_torch()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    no_gpu = pytest.mark.skip(reason="needs CuPy and an NVIDIA GPU")
    one_gpu = pytest.mark.skip(reason="needs two or more NVIDIA GPUs")
    for item in items:
        if "multigpu" in item.keywords and GPU_COUNT < 2:
            item.add_marker(one_gpu)
        elif "gpu" in item.keywords and not GPU_AVAILABLE:
            item.add_marker(no_gpu)
