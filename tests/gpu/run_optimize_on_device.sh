#!/usr/bin/env bash
# The optimizer on the GPU machine, in one go. Run from the repository root (PYTHONPATH as for
# tests/gpu/run_on_device.sh). Verifies the candidates generated on the CPU machine
# (benchmarks/results/optimize_candidates*, from `optimize_suite.py --generate-only DIR`), then runs
# the GPU tests of the whole loop. Logs and results go under $OUT (default ./gpu-out).
#   tests/gpu/run_optimize_on_device.sh [all|bench|tests]   (bench ~6-8 min: 42 candidates; tests ~2 min)
set -u
MODE=${1:-all}
. "$(dirname "$0")/_env.sh"
status=0
if [ "$MODE" != tests ]; then
# Rules only (deterministic candidates).
python3 benchmarks/optimize_suite.py --verify-dir benchmarks/results/optimize_candidates \
  --out "$OUT/optimize_suite.json" >"$OUT/optimize_suite.log" 2>&1 || status=1
tail -n 14 "$OUT/optimize_suite.log"
# Rules plus the 0.5B model's candidates, when they were generated.
if [ -f benchmarks/results/optimize_candidates_model/generation.json ]; then
  python3 benchmarks/optimize_suite.py --verify-dir benchmarks/results/optimize_candidates_model \
    --out "$OUT/optimize_suite_model.json" >"$OUT/optimize_suite_model.log" 2>&1 || status=1
  tail -n 14 "$OUT/optimize_suite_model.log"
fi
fi
if [ "$MODE" != bench ] && python3 -c "import pytest" 2>/dev/null; then
  python3 -m pytest -v -m gpu -p no:cacheprovider -o addopts="" tests/gpu/test_optimize.py >"$OUT/optimize_tests.log" 2>&1 || status=1
  grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" "$OUT/optimize_tests.log" | tail -n 20
fi
exit $status
