#!/usr/bin/env bash
# The GPU check in one go: the gpu-marked tests, then the GPU benchmarks.
#   bash tests/benchmarks/gpu_suite.sh [--markdown] [log-dir]
# Logs go to log-dir (default ./gpu-logs); a short summary is printed last.  --markdown
# is passed to every benchmark: their logs are then Markdown tables for docs/benchmarks.md.
set -u
markdown=
if [ "${1:-}" = --markdown ]; then markdown=--markdown; shift; fi
logs=${1:-gpu-logs}
mkdir -p "$logs"
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > "$logs/gpu.txt" 2>&1
timeout "${TEST_SECONDS:-300}" python3 -m pytest -m gpu tests -q -n "${WORKERS:-8}" --tb=short \
    -p no:cacheprovider -o addopts="" --ignore=tests/benchmarks > "$logs/tests.log" 2>&1
echo "tests exit code $?" >> "$logs/tests.log"
timeout "${BENCH_SECONDS:-150}" python3 tests/benchmarks/gpu_ops.py $markdown > "$logs/gpu_ops.log" 2>&1
timeout "${BENCH_SECONDS:-150}" python3 tests/benchmarks/optim_bench.py --device cuda $markdown > "$logs/optim.log" 2>&1
timeout "${BENCH_SECONDS:-150}" python3 tests/benchmarks/unet_bench.py --device cuda $markdown > "$logs/unet.log" 2>&1
echo "== failures"; grep -E "^(FAILED|ERROR)" "$logs/tests.log" | head -40
echo "== tests"; tail -2 "$logs/tests.log"
echo "== gpu_ops"; tail -45 "$logs/gpu_ops.log"
echo "== optim"; tail -12 "$logs/optim.log"
echo "== unet"; tail -5 "$logs/unet.log"
timeout 120 python3 tests/benchmarks/host_profile.py $markdown > "$logs/host_profile.log" 2>&1
echo "== host profile"; cat "$logs/host_profile.log"
