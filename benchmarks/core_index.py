"""Benchmark: full and incremental kernel indexing of a generated 10,000-line CUDA file.

Run: ``.venv/bin/python benchmarks/core_index.py [--lines 10000] [--edits 100] [--json benchmarks/results/core_index.json]``

Prints a table of p50/p99 in milliseconds, wall clock (``time.perf_counter``)
and CPU time of this process (``time.process_time``, which is what to compare
on a shared, loaded machine), for: full parse, full index, incremental reparse after a one-character edit,
incremental re-index after that edit, the same for an edit that inserts a
line (every later function moves), and the one-character edit sent as a
full-document replacement (``replace_all``). Writes every raw sample to the JSON file
with the machine, the date and the command.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable

from kernel_lsp.core.index import IncrementalIndexer
from kernel_lsp.core.parse import ParsedDocument

KERNEL = """\
__global__ void __launch_bounds__(256) kernel_{i}(const float* __restrict__ in, float* out, int n) {{
    __shared__ float tile[TILE][TILE + 1];
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    for (int s = idx; s < n; s += blockDim.x * gridDim.x) {{
        #pragma unroll
        for (int k = 0; k < 4; ++k) {{
            out[s] += in[s * 4 + k];
        }}
    }}
    if (threadIdx.x == 0) atomicAdd(&out[0], 1.0f);
    __syncthreads();
}}

void launch_{i}(const float* in, float* out, int n, cudaStream_t stream) {{
    dim3 block(BLOCK);
    kernel_{i}<<<(n + BLOCK - 1) / BLOCK, block, 0, stream>>>(in, out, n);
}}
"""


def generate(lines: int) -> str:
    parts = ["#include <cuda_runtime.h>\n#define BLOCK 256\nconstexpr int TILE = 32;\n"]
    count, i = 3, 0
    while count < lines:
        chunk = KERNEL.format(i=i)
        parts.append(chunk)
        count += chunk.count("\n")
        i += 1
    return "".join(parts)


def _quantiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=10_000)
    ap.add_argument("--edits", type=int, default=100)
    ap.add_argument("--json", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "core_index.json"),
                    help="where to write raw samples (JSON)")
    args = ap.parse_args()
    source = generate(args.lines)
    samples: dict[str, list[float]] = {}

    def timed(name: str, fn: Callable[[], object]) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        samples.setdefault(f"{name}_wall", []).append((time.perf_counter() - wall) * 1e3)
        samples.setdefault(f"{name}_cpu", []).append((time.process_time() - cpu) * 1e3)

    doc = ParsedDocument(source)
    index = IncrementalIndexer().index(doc)
    for _ in range(5):
        timed("parse_full", lambda: ParsedDocument(source))
        timed("index_full", lambda: IncrementalIndexer().index(doc))
    indexer = IncrementalIndexer()
    indexer.index(doc)
    middle = source.count("\n") // 2
    line = next(i for i in range(middle, middle + 30) if source.splitlines()[i].startswith("    int idx"))
    offset = sum(len(x) + 1 for x in source.split("\n")[:line]) + 4
    for _ in range(args.edits):
        for kind, (insert, remove_end) in {"char": ("x", (line, 5)), "newline": ("\n", (line + 1, 0))}.items():
            timed(f"reparse_{kind}", lambda insert=insert: doc.apply_edit(line, 4, line, 4, insert))
            timed(f"reindex_{kind}", lambda: indexer.index(doc))
            doc.apply_edit(line, 4, *remove_end, "")
            indexer.index(doc)
        # Clients with full-document sync send the whole text: the changed region is diffed out.
        edited = source[: offset] + "x" + source[offset:]
        timed("fullsync_reparse_char", lambda: doc.replace_all(edited))
        timed("fullsync_reindex_char", lambda: indexer.index(doc))
        doc.replace_all(source)
        indexer.index(doc)
    print(f"{args.lines} lines, {len(source)} bytes, {len(index.functions)} functions, {len(index.launches)} launches")
    print(f"{'measure':<18}{'p50 ms':>10}{'p99 ms':>10}{'n':>6}")
    for name, values in samples.items():
        p50, p99 = _quantiles(values)
        print(f"{name:<18}{p50:>10.2f}{p99:>10.2f}{len(values):>6}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(
                {
                    "machine": platform.platform(),
                    "cpu_count": os.cpu_count(),
                    "load_avg": os.getloadavg(),
                    "python": sys.version,
                    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                    "command": " ".join(sys.argv),
                    "unit": "ms",
                    "samples": samples,
                },
                fh,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
