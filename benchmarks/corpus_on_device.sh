#!/usr/bin/env bash
# benchmarks/corpus_suite.py on the GPU machine in one call: from the repository root, with the project's
# wheels for the machine's Python in ./.whl (pycuda and its needs, pygls, lsprotocol, tree-sitter, pcpp …):
#   bash benchmarks/corpus_on_device.sh NAME LIMIT_S ARGS...
# runs `corpus_suite.py ARGS... --out $OUT/NAME.json` for at most LIMIT_S seconds (the file is written
# after every kernel, so a run cut short keeps what it measured) with its log in $OUT/NAME.log.
set -u
. "$(dirname "$0")/../tests/gpu/_env.sh"
name=$1 limit=$2
shift 2
if [ ! -d /tmp/site/pycuda ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /tmp/pip.log 2>&1 \
    || { echo "pip install failed:"; tail -n 5 /tmp/pip.log; }
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader || true
timeout -k 5 "$limit" python3 benchmarks/corpus_suite.py "$@" --out "$OUT/$name.json" > "$OUT/$name.log" 2>&1
echo "== $name: exit $? ($(grep -c candidates, "$OUT/$name.log") kernels)"
tail -n 4 "$OUT/$name.log"
