#!/usr/bin/env bash
# Everything the harness needs checked on the GPU machine, in one go.
# Run from the repository root after:
#   python3 -m pip install --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
# Logs and results go under $OUT (default ./gpu-out).
#   tests/gpu/run_on_device.sh [all|tests|bench]   (default all; tests and bench each take ~5 min)
set -u
MODE=${1:-all}
. "$(dirname "$0")/_env.sh"
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.sm,clocks.max.sm --format=csv || true
  which nvcc compute-sanitizer python3 || true
  python3 -c "import numpy, pycuda.driver as d; d.init(); print('pycuda ok, devices:', d.Device.count())"
} >"$OUT/env.log" 2>&1
cat "$OUT/env.log"

status=0
if [ "$MODE" = bench ]; then
  :
elif python3 -c "import pytest" 2>/dev/null; then
  # CPU unit tests of the harness first: the device has another Python (3.12) and another numpy.
  python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/unit/test_expr.py tests/unit/test_spec.py tests/unit/test_inputs.py \
    tests/unit/test_compare.py tests/unit/test_stats.py tests/unit/test_static_check.py tests/unit/test_harness_protocol.py \
    tests/unit/test_harness_verify.py tests/unit/test_verdict.py >"$OUT/unit.log" 2>&1 || status=1
  tail -n 5 "$OUT/unit.log"
  HARNESS_RESULTS="$OUT/harness_examples.json" python3 -m pytest -v -s -m gpu -p no:cacheprovider -o addopts="" \
    tests/gpu/test_harness_examples.py tests/gpu/test_harness_launch.py tests/gpu/test_harness_backend.py >"$OUT/gpu_tests.log" 2>&1 || status=1
  grep -E "PASSED|FAILED|ERROR|SKIPPED|ACCEPTED|REJECTED|passed|failed" "$OUT/gpu_tests.log" | tail -n 80
else
  echo "pytest is not installed here: the benchmark below checks every manifest verdict instead"
fi

if [ "$MODE" != tests ]; then
  python3 benchmarks/harness_overhead.py --out "$OUT/harness_overhead.json" >"$OUT/benchmark.log" 2>&1 || status=1
  cat "$OUT/benchmark.log"
fi
exit $status
