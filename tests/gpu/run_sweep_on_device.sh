#!/usr/bin/env bash
# The sweep on the GPU machine: the Ray GPU test, then benchmarks/sweep_suite.py. Run from the repository root after
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
# (.whl: the stripped Ray wheel of tests/gpu/strip_ray_wheel.py plus jsonschema, jsonschema-specifications,
# referencing and rpds-py; the image has Ray's other needs). Logs and results go under $OUT (default ./gpu-out).
#   tests/gpu/run_sweep_on_device.sh [tests|bench|all] [sweep_suite.py arguments...]   (default all)
set -u
MODE=${1:-all}
shift || true
. "$(dirname "$0")/_env.sh"
status=0
if [ "$MODE" != bench ]; then
  python3 -m pytest -v -s -m gpu -p no:cacheprovider -o addopts="" tests/gpu/test_sweep_gpu.py >"$OUT/sweep_gpu_test.log" 2>&1 || status=1
  tail -n 15 "$OUT/sweep_gpu_test.log"
fi
if [ "$MODE" != tests ]; then
  python3 benchmarks/sweep_suite.py --out "$OUT/sweep_suite.json" "$@" >"$OUT/sweep_suite.log" 2>&1 || status=1
  tail -n 40 "$OUT/sweep_suite.log"
fi
exit $status
