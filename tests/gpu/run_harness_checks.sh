#!/usr/bin/env bash
# The harness checks of issue 24 on the GPU machine, in about 7 minutes. From the repository root:
#   python3 -m pip install --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
#   OUT=/some/dir tests/gpu/run_harness_checks.sh
# Writes under $OUT (default ./gpu-out):
#   env.log                 the GPU, driver, tools
#   manifest.log / examples_verdicts.json   examples/verify_manifest.py: every manifest entry through the CLI
#   benchmark.log / harness_overhead.json   benchmarks/harness_overhead.py: rows (name, wall_s, sanitize,
#                           sizes_tried, timed_checks), the median, the max and the hang case
#   unit.log                CPU tests of the harness's host-side logic (this machine's Python and numpy)
#   gpu_tests.log / harness_examples.json   pytest -m gpu tests/gpu/test_harness_*.py (the manifest again
#                           through verify(), device kernels against their numpy twins, red zones, module
#                           variables, a real hang ending in seconds, sizes the spec does not name)
# The manifest and the benchmark come first: their JSON is what gets committed. Each step has its own
# time limit so the whole run ends within ~9.5 minutes; the long steps write their JSON after every
# entry, so a step cut short still leaves its measurements. Exit status 0 when every step passed.
set -u
. "$(dirname "$0")/_env.sh"
case ":${PYTHONPATH:-}:" in *":$PWD:"*) ;; *) export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" ;; esac
start=$(date +%s)
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.sm,clocks.max.sm --format=csv || true
  which nvcc compute-sanitizer python3 || true
  python3 -c "import numpy, pycuda.driver as d; d.init(); print('python', __import__('sys').version.split()[0], 'numpy', numpy.__version__, 'pycuda ok, devices:', d.Device.count())"
} >"$OUT/env.log" 2>&1
cat "$OUT/env.log"

status=0
step() {  # step NAME LIMIT_S COMMAND...
  local name=$1 limit=$2
  shift 2
  local t0=$(date +%s)
  timeout -k 10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc in $(( $(date +%s) - t0 )) s (limit $limit s)"
  [ $rc -eq 0 ] || status=1
}

step manifest 170 python3 examples/verify_manifest.py --out "$OUT/examples_verdicts.json" --timeout 120
cat "$OUT/manifest.log"
step benchmark 160 python3 benchmarks/harness_overhead.py --out "$OUT/harness_overhead.json"
cat "$OUT/benchmark.log"
if python3 -c "import pytest" 2>/dev/null; then
  step unit 40 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/unit/test_compare.py tests/unit/test_inputs.py \
    tests/unit/test_harness_protocol.py tests/unit/test_harness_timing.py tests/unit/test_harness_sizes.py tests/unit/test_verdict.py
  tail -n 3 "$OUT/unit.log"
  export HARNESS_RESULTS="$OUT/harness_examples.json"
  step gpu_tests 200 python3 -m pytest -v -m gpu -p no:cacheprovider -o addopts="" tests/gpu/test_harness_*.py
  grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" "$OUT/gpu_tests.log" | tail -n 70
else
  echo "pytest is not installed here: skipping the unit and GPU tests; the manifest and the benchmark checked every verdict"
fi
echo "total $(( $(date +%s) - start )) s, status $status"
exit $status
