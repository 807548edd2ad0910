"""Each backend states in one place which function serves every protocol method
(``backends/dispatch.py``), and that table is what runs."""

import inspect

import pytest

from tensorcore.backends import base, dispatch
from tensorcore.backends.bfloat16 import FLOAT32_COMPUTED_OPS
from tensorcore.backends.numba.backend import METHODS as NUMBA_METHODS, NumbaBackend
from tensorcore.backends.numpy.backend import METHODS as NUMPY_METHODS, NumpyBackend

BACKENDS = [(NumpyBackend, NUMPY_METHODS, None), (NumbaBackend, NUMBA_METHODS, NumpyBackend)]


def _served(function):
    """The kernel behind a method: seen through write noting and the bfloat16 policy."""
    function = getattr(function, "__wrapped__", function)
    return getattr(function, "kernel", function)


def test_protocol_methods_are_the_protocol():
    names = dispatch.protocol_methods()
    assert len(names) == len(set(names)) > 70
    assert {"conv2d", "matmul", "group_norm", "prepare", "release_stream"} <= set(names)


@pytest.mark.parametrize("cls, table, parent", BACKENDS, ids=lambda v: getattr(v, "__name__", ""))
def test_every_protocol_method_is_served_once_by_what_the_table_names(cls, table, parent):
    for name in dispatch.protocol_methods():
        runs = vars(cls)[name]  # set on the class itself: no base's order decides it
        if name in table:
            assert _served(runs) is _served(table[name]), name
        elif parent is not None and name not in _own_body(cls):
            assert _served(runs) is _served(vars(parent)[name]), name
        else:
            assert name in _own_body(cls), name


@pytest.mark.gpu
def test_cupy_table_is_what_runs():
    from tensorcore.backends.cupy.backend import METHODS, CupyBackend

    test_every_protocol_method_is_served_once_by_what_the_table_names(CupyBackend, METHODS, NumpyBackend)
    test_no_kernel_group_defines_a_protocol_method_nothing_serves(CupyBackend, METHODS, NumpyBackend)
    assert dispatch.table(CupyBackend)["conv2d"] == "CupyLinalgKernels.conv2d"


def _own_body(cls):
    source = inspect.getsource(cls)
    return {name for name in dispatch.protocol_methods() if f"    def {name}(" in source}


@pytest.mark.parametrize("cls, table, parent", BACKENDS, ids=lambda v: getattr(v, "__name__", ""))
def test_no_kernel_group_defines_a_protocol_method_nothing_serves(cls, table, parent):
    """A kernel group's protocol method is served by its backend's table (or an ancestor
    backend's): an override the table leaves out would be dead code."""
    served = {_served(getattr(klass, name)) for klass in cls.__mro__ if dispatch.is_served(klass)
              for name in dispatch.protocol_methods()}
    for klass in cls.__mro__:
        if dispatch.is_served(klass) or klass is object:
            continue
        for name in dispatch.protocol_methods():
            if name in vars(klass):
                assert vars(klass)[name] in served, f"{klass.__name__}.{name}"


def test_bfloat16_policy_wraps_exactly_the_float32_computed_ops():
    wrapped = {name for name, f in NUMPY_METHODS.items() if hasattr(f, "kernel")}
    assert wrapped == set(FLOAT32_COMPUTED_OPS)


def test_a_table_that_misses_or_doubles_a_method_is_refused():
    table = dict(NUMPY_METHODS)
    del table["conv2d"]
    with pytest.raises(TypeError, match="not served.*conv2d"):
        dispatch.serving(table)(type("Partial", (), {}))
    with pytest.raises(TypeError, match="served twice.*matmul"):
        dispatch.serving(NUMPY_METHODS)(type("Doubled", (), {"matmul": lambda self, a, b: a}))


def test_the_printed_table_names_the_kernels():
    table = dispatch.table(NumbaBackend)
    assert table["conv2d"] == "NumbaSpatialKernels.conv2d"
    assert table["attention"] == "NumbaAttentionKernels.attention"
    assert table["matmul"] == "computes_in_float32(NumpyPrimitives.matmul)"
    assert table["binary"] == "NumpyPrimitives.binary"


def test_protocol_signature_matches_each_served_method():
    for cls, _, _ in BACKENDS:
        for name in dispatch.protocol_methods():
            kernel = _served(getattr(cls, name))
            wanted = [p for p in inspect.signature(getattr(base.Backend, name)).parameters]
            got = list(inspect.signature(kernel).parameters)
            assert got[:len(wanted)] == wanted or got[1:] == ["args", "kwargs"], (cls.__name__, name, got)
