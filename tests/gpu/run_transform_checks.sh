#!/usr/bin/env bash
# The transformations' GPU checks and the first save, in one call of about 4 minutes. From the repository
# root, with the project's wheels in ./.whl:
#   bash tests/gpu/run_transform_checks.sh
# Writes under $OUT (default ./gpu-out):
#   first_save.json / .log        benchmarks/first_save.py after a 4 s wait (the save's two compiles shared)
#   optimize_suite.json / .log    benchmarks/optimize_suite.py --budget 8, rules only: the examples that
#                                 gained candidates (EXAMPLES=..., default softmax,histogram)
#   transform_tests.log           pytest -m gpu: the optimizer, and every snippet rewrite of the stencil,
#                                 tiled, under-filled, reduction and atomic families through the harness
#   families.json, reduce_family.json  those snippets' verdicts
# Each step has its own time limit; exit status 0 when every step passed.
set -u
. "$(dirname "$0")/_env.sh"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /tmp/pip.log 2>&1 \
  || { echo "pip install failed:"; tail -n 5 /tmp/pip.log; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 OUT
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader || true
status=0
step() {  # step NAME LIMIT_S COMMAND...
  local name=$1 limit=$2
  shift 2
  local t0=$(date +%s)
  timeout -k 5 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc in $(( $(date +%s) - t0 )) s (limit $limit s)"
  [ $rc -eq 0 ] || status=1
}
step first_save 40 python3 benchmarks/first_save.py --open-wait-s 4 --out "$OUT/first_save.json"
tail -n 6 "$OUT/first_save.log"
step optimize_suite 90 python3 benchmarks/optimize_suite.py --budget 8 --examples "${EXAMPLES:-softmax,histogram}" \
  --out "$OUT/optimize_suite.json"
tail -n 6 "$OUT/optimize_suite.log"
export FAMILY_RESULTS="$OUT/families.json" REDUCE_RESULTS="$OUT/reduce_family.json"
step transform_tests 125 python3 -m pytest -q -m gpu -p no:cacheprovider -o addopts="" \
  tests/gpu/test_optimize.py tests/gpu/test_stencil_families_gpu.py $(ls tests/gpu/test_*reduc*_gpu.py tests/gpu/test_*atomic*_gpu.py 2>/dev/null)
tail -n 15 "$OUT/transform_tests.log"
echo "total $(( $(date +%s) - start )) s, status $status"
exit $status
