#!/usr/bin/env bash
# The editor's and the harness's GPU checks on the merged code, in one call of under 10 minutes.
# From the repository root, with the project's wheels in ./.whl (pycuda, CUPTI, tree-sitter, pygls, ...):
#   bash tests/gpu/run_editor_checks.sh
# Writes under $OUT (default ./gpu-out):
#   env.log                     the GPU, driver, tools
#   harness_tests.log           pytest -m gpu of the harness (backend, launch, unnamed sizes, every example)
#   editor_gpu_tests.log        pytest -m gpu: first save through the server, CUPTI, profile, report
#   first_save.json / .log      benchmarks/first_save.py: didSave to a hover with the profile
#   profile_cost_cupti.json / .log  benchmarks/profile_cost.py --cupti: first and prepared CUPTI profiles
#                               against ncu --set full, classes against the full profile's
#   cli.log                     profile's exit code on a GPU; sweep over examples/ (local engine, budget 2)
# Each step has its own time limit; exit status 0 when every step passed.
set -u
. "$(dirname "$0")/_env.sh"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > "$OUT/pip.log" 2>&1 \
  || echo "pip install failed: see $OUT/pip.log"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 OUT
start=$(date +%s)
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.sm,clocks.max.sm --format=csv || true
  python3 -c "import sys, numpy, pycuda.driver as d; d.init(); print('python', sys.version.split()[0], 'numpy', numpy.__version__, 'devices', d.Device.count())"
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
step harness_tests 170 python3 -m pytest -q -m gpu -p no:cacheprovider -o addopts="" tests/gpu/test_harness_backend.py \
  tests/gpu/test_harness_launch.py tests/gpu/test_harness_unnamed_sizes.py tests/gpu/test_harness_examples.py
tail -n 3 "$OUT/harness_tests.log"
step editor_gpu_tests 150 python3 -m pytest -v -m gpu -p no:cacheprovider -o addopts="" tests/gpu/test_first_save.py \
  tests/gpu/test_cupti_gpu.py tests/gpu/test_profile_gpu.py tests/gpu/test_report_gpu.py
grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" "$OUT/editor_gpu_tests.log" | tail -n 25
step first_save 100 python3 benchmarks/first_save.py --out "$OUT/first_save.json"
tail -n 12 "$OUT/first_save.log"
step profile_cost_cupti 130 python3 benchmarks/profile_cost.py --cupti --no-programs --no-floor --budget-s 100 \
  --corpus-no-ncu-tree --corpus howto_reduce_v0,shoc_reduction,llmc_layernorm_forward_kernel1,polybench_gemm \
  --out "$OUT/profile_cost_cupti.json"
tail -n 30 "$OUT/profile_cost_cupti.log"
{
  python3 -m kernel_lsp profile examples/gemv/original.cu --spec examples/gemv/spec.json; echo "profile rc=$?"
  timeout 60 python3 -m kernel_lsp sweep examples --budget 2 --seconds 6 --kb /tmp/sweep_kb.sqlite --out /tmp/sweep_examples; echo "sweep rc=$?"
} > "$OUT/cli.log" 2>&1
grep -E "rc=|listed|accepted|optimized|kernels" "$OUT/cli.log" | tail -n 15
echo "total $(( $(date +%s) - start )) s, status $status"
exit $status
