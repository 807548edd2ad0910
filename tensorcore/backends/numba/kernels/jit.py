"""The decorators every kernel module uses, so all kernels compile alike.

* ``kernel``: an entry point called from the backend; its parallel loops are
  ``parallel.parallel_for`` calls, and it runs on one thread when its arrays are small
  (``numba/threads.py``).
* ``helper``: a serial function called from kernels (inlined by LLVM).
* ``inlined``: a serial function inlined into its callers by Numba, for helpers a
  parallel loop calls once per short row or plane: a call costs tens of nanoseconds
  (the array views passed to it are reference counted with atomic updates), which
  is as much as a whole 64-element row of work.
* ``wide_vectors()``: called first thing in a function, lets LLVM use 512-bit vectors
  in it (see its docstring).

No fast-math: every kernel computes the same bits wherever its code ends up.  LLVM
compiles a function again in each module that links it (a kernel calling a helper, a
native plan calling a kernel), and with ``reassoc`` or ``contract`` each copy may sum in
another order or fuse other multiply-adds, so a kernel compiled in this process and the
same kernel loaded from the disk cache gave different last bits.  Reductions that need
vector speed keep several partial sums in a fixed pattern (``lanes.py``), which LLVM
vectorises without reordering anything.  ``error_model="numpy"`` drops the
per-division zero check that would otherwise block vectorisation; ``cache=True`` stores
compiled code next to the sources, so only the first process pays the compile time.
Nothing is compiled with Numba's ``parallel=True`` (see ``parallel.py`` for why).
"""

from __future__ import annotations

from numba import njit, types
from numba.extending import intrinsic

from tensorcore.backends.numba import threads

JIT_OPTIONS = {"error_model": "numpy"}

helper = njit(cache=True, **JIT_OPTIONS)
inlined = njit(inline="always", cache=True, **JIT_OPTIONS)


def kernel(fn):
    """``fn`` compiled as a kernel whose parallel loops run serially on small arrays."""
    return threads.SizedKernel(helper(fn))


def thread_count() -> int:
    """Threads a large kernel runs on (``tc.set_num_threads``; default every core)."""
    return threads.get_num_threads()


_WIDE_ATTRIBUTES = ('"prefer-vector-width"="512"', '"min-legal-vector-width"="512"')


def allow_wide_vectors(function) -> None:
    """Tag the LLVM ``function`` so its 512-bit vector code stays in 512-bit registers.

    ``prefer-vector-width`` lets LLVM's vectorisers pick 512-bit vectors;
    ``min-legal-vector-width`` keeps explicit 512-bit vector IR (``lanes.py``,
    ``block_products.py``) in 512-bit registers where LLVM would otherwise split each
    operation in two 256-bit halves, and LLVM carries it over to any function the code
    is inlined into.  llvmlite's attribute set accepts only a fixed list of names, so
    the string attributes are added with the plain ``set.add``; if a llvmlite version
    refuses them, the hint is dropped."""
    for attribute in _WIDE_ATTRIBUTES:
        try:
            set.add(function.attributes, attribute)
        except TypeError:
            pass


@intrinsic
def wide_vectors(typingctx):
    """Ask LLVM to vectorise the enclosing function with 512-bit vectors.

    On AVX-512 CPUs LLVM defaults to 256-bit vectors (wide ones can lower the clock
    of a whole core), which halves the throughput of compute-bound loops such as
    the polynomial ``exp`` of softmax.  Called in a parallel loop's body function it
    tags that function (``allow_wide_vectors``); CPUs without 512-bit registers ignore it.
    """
    def codegen(context, builder, signature, args):
        allow_wide_vectors(builder.function)
        return context.get_dummy_value()

    return types.none(), codegen
