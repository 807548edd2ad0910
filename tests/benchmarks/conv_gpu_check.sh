#!/usr/bin/env bash
# The convolution kernels' GPU check in one command: compile every kernel instantiation
# (in parallel, filling CuPy's kernel cache), run the convolution GPU tests, then
# conv_bench.py; logs under the log dir, a short summary printed last.
#   bash tests/benchmarks/conv_gpu_check.sh [log-dir] [all|tests|bench]
# log-dir defaults to $OUT, else ./gpu-logs; "tests" stops after the tests, "bench" skips
# them (each half fits a 10-minute limit).  Time limits: TEST_SECONDS (default 240),
# BENCH_SECONDS (default 330); BENCH_ARGS is passed to conv_bench.py ("--quick", "--tiles",
# "--markdown" for its tables in Markdown).
set -u
logs=${1:-${OUT:-gpu-logs}}
stage=${2:-all}
mkdir -p "$logs"
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > "$logs/gpu.txt" 2>&1
start=$(date +%s)
timeout 300 python3 - > "$logs/compile.log" 2>&1 <<'PY'
# one process per kernel (forked before any CUDA use), each compiling into CuPy's cache
import time
from concurrent.futures import ProcessPoolExecutor

from tensorcore.backends.cupy import loader
from tensorcore.backends.cupy import conv_plan


def build(job: str) -> None:
    if job in ("float32", "float16", "bfloat16"):
        import tensorcore as tc

        loader.kernel(conv_plan.SOURCE, "conv_pack_kernel", getattr(tc, job))
    else:
        loader.raw_instance(conv_plan.SOURCE, job).kernel


t0 = time.time()
jobs = ["float32", "float16", "bfloat16", *conv_plan.instances()]
with ProcessPoolExecutor(8) as pool:
    list(pool.map(build, jobs))
print(f"compiled {len(jobs)} kernel modules in {time.time() - t0:.1f} s")
PY
echo "compile exit code $?" >> "$logs/compile.log"
if [ "$stage" != bench ]; then
    timeout "${TEST_SECONDS:-240}" python3 -m pytest -m gpu tests/test_cuda_conv.py \
        tests/test_conv_epilogue.py tests/test_cuda_backend.py tests/test_layers_gpu.py \
        -q -n "${WORKERS:-4}" --tb=short -p no:cacheprovider -o addopts="" > "$logs/tests.log" 2>&1
    echo "tests exit code $?" >> "$logs/tests.log"
fi
if [ "$stage" != tests ]; then
    timeout "${BENCH_SECONDS:-330}" python3 tests/benchmarks/conv_bench.py ${BENCH_ARGS:-} \
        > "$logs/conv_bench.log" 2>&1
    echo "bench exit code $?" >> "$logs/conv_bench.log"
fi
echo "== $(cat "$logs/gpu.txt"), $(( $(date +%s) - start )) s"
tail -2 "$logs/compile.log"
if [ "$stage" != bench ]; then
    echo "== failures"; grep -E "^(FAILED|ERROR)" "$logs/tests.log" | head -30
    echo "== tests"; tail -2 "$logs/tests.log"
fi
if [ "$stage" != tests ]; then
    echo "== bench"; grep -E "^Targets" -A 10 "$logs/conv_bench.log"
    grep -E "^UNet forward convolutions" -A 5 "$logs/conv_bench.log"; grep -E "exit code" "$logs/conv_bench.log"
fi
