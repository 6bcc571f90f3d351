#!/usr/bin/env bash
# The distilled model's training on the GPU machine, in one call, from the repository root:
#   bash training/device_run.sh
# Needs, carried in ignored folders (earlier calls' carried files stay while the machine is warm):
#   .model/   the base GGUF in parts: training/chunks.py split BASE.gguf --into .model --max-mib 50
#             (a call carries at most 64 MiB: one part a call, the manifest with the last)
#   .whl/     wheels the machine lacks: gguf (transformers' GGUF loading and the conversion), platformdirs
# Writes under $OUT (default ./device-out): adapter.gguf in parts of at most 15 MiB and their manifest
# (training/chunks.py join OUT/adapter.gguf.manifest.json --out adapter.gguf), train_log.json, train.log.
# TRAIN_ARGS go to training/train_lora.py (e.g. "--epochs 3 --rank 16"); DEVICE=cpu runs it on a CPU.
set -u
OUT=${OUT:-./device-out}
mkdir -p "$OUT"
start=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /tmp/pip.log 2>&1 \
  || { echo "pip install failed:"; tail -n 5 /tmp/pip.log; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
manifest=$(ls .model/*.manifest.json 2>/dev/null | head -n 1)
[ -n "$manifest" ] || { echo "no .model/*.manifest.json: carry the base model's parts first"; exit 1; }
mkdir -p /tmp/base
python3 training/chunks.py join "$manifest" --out /tmp/base/base.gguf || exit 1
echo "== base joined in $(( $(date +%s) - start )) s"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || true
# shellcheck disable=SC2086  # TRAIN_ARGS is a list of arguments
timeout -k 10 "${TRAIN_LIMIT_S:-1200}" python3 training/train_lora.py --base /tmp/base/base.gguf --out /tmp/run \
  --device "${DEVICE:-cuda}" ${TRAIN_ARGS:-} > "$OUT/train.log" 2>&1
status=$?
grep -v "it/s]" "$OUT/train.log" | tail -n 8
[ $status -eq 0 ] || { echo "train_lora.py exited $status"; exit $status; }
python3 training/chunks.py split /tmp/run/adapter.gguf --into "$OUT" --max-mib 15
cp /tmp/run/train_log.json "$OUT/"
echo "total $(( $(date +%s) - start )) s"
