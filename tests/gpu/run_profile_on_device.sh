#!/usr/bin/env bash
# The profiler's GPU checks and its benchmark, in one go (about 5 minutes).
# Run from the repository root after:
#   python3 -m pip install --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
# Results go under $OUT (default ./gpu-out): profile_gpu_tests.log, profile_cost.json, profile_cost.log.
set -u
. "$(dirname "$0")/_env.sh"
ncu --version | tail -1
status=0
if python3 -c "import pytest" 2>/dev/null; then
  python3 -m pytest -v -m gpu -p no:cacheprovider -o addopts="" tests/gpu/test_profile_gpu.py \
    >"$OUT/profile_gpu_tests.log" 2>&1 || status=1
  grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" "$OUT/profile_gpu_tests.log" | tail -n 20
  # the CPU tests of the profiler on the device's Python (3.12)
  python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/unit/test_profile.py tests/unit/test_classify.py \
    tests/unit/test_tree.py tests/unit/test_ncu_reader.py tests/unit/test_spec_draft.py >"$OUT/profile_unit.log" 2>&1 || status=1
  tail -n 3 "$OUT/profile_unit.log"
fi
python3 benchmarks/profile_cost.py --out "$OUT/profile_cost.json" >"$OUT/profile_cost.log" 2>&1 || status=1
cat "$OUT/profile_cost.log"
exit $status
