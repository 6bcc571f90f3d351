"""Benchmark: a save's compile when the text was compiled before (on open, or by ``compileOnChange``).

Run: ``.venv/bin/python benchmarks/compile_reuse.py [--repeats 5] [--json benchmarks/results/compile_reuse.json]``

For each example's ``original.cu`` the compile the server makes on open and again on save
(:func:`kernel_lsp.services.toolchain.compile_source` with the default settings, the real nvcc), side by
side in one run, interleaved: **cold** with the finished compiles forgotten (what every save paid before
they were kept), **reused** right after one (the save of a text already compiled, nothing it read changed).
The reused time is what checking the ``-MD`` list's files costs. Needs nvcc on PATH; no GPU.

Prints a table (median and max per example) and writes every raw sample to the JSON file with the
machine, the date and the command.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from kernel_lsp.config import Settings  # noqa: E402
from kernel_lsp.services import toolchain  # noqa: E402


def examples() -> list[str]:
    folder = os.path.join(ROOT, "examples")
    return sorted(name for name in os.listdir(folder) if os.path.isfile(os.path.join(folder, name, "original.cu")))


def timed_compile(path: str, text: str) -> tuple[float, bool]:
    start = time.perf_counter()
    result = toolchain.compile_source(text, path, Settings())
    return time.perf_counter() - start, result.ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=os.path.join(ROOT, "benchmarks", "results", "compile_reuse.json"))
    args = parser.parse_args()
    if shutil.which("nvcc") is None:
        print("compile_reuse: nvcc is not on PATH", file=sys.stderr)
        return 2
    rows = []
    print(f"{'example':<22}{'cold median s':>15}{'cold max s':>12}{'reused median ms':>18}{'reused max ms':>15}")
    for name in examples():
        path = os.path.join(ROOT, "examples", name, "original.cu")
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        cold, reused, ok = [], [], True
        for _ in range(args.repeats):
            toolchain._FINISHED.clear()
            wall_s, built = timed_compile(path, text)
            cold.append(wall_s)
            again_s, built_again = timed_compile(path, text)
            reused.append(again_s)
            ok = ok and built and built_again
        rows.append({"example": name, "ok": ok, "cold_s": cold, "reused_s": reused})
        print(f"{name:<22}{statistics.median(cold):>15.3f}{max(cold):>12.3f}"
              f"{statistics.median(reused) * 1000:>18.2f}{max(reused) * 1000:>15.2f}")
    toolchain._FINISHED.clear()
    all_cold = [s for row in rows for s in row["cold_s"]]
    all_reused = [s for row in rows for s in row["reused_s"]]
    summary = {"examples": len(rows), "all_ok": all(row["ok"] for row in rows),
               "cold_median_s": statistics.median(all_cold), "reused_median_s": statistics.median(all_reused),
               "reused_max_s": max(all_reused)}
    print(f"all: cold median {summary['cold_median_s']:.3f} s, reused median {summary['reused_median_s'] * 1000:.2f} ms, "
          f"max {summary['reused_max_s'] * 1000:.2f} ms")
    nvcc = toolchain.proc.run(["nvcc", "--version"], timeout_s=30).stdout.strip().splitlines()
    report = {
        "benchmark": "compile_reuse",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.relpath(sys.executable, ROOT) if sys.executable.startswith(ROOT) else "python",
                             *sys.argv]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "nvcc": nvcc[-1] if nvcc else None, "load_average_1_5_15_min": list(os.getloadavg())},
        "units": "seconds, wall clock of compile_source; cold: finished compiles forgotten first",
        "summary": summary,
        "rows": rows,
    }
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=1)
        handle.write("\n")
    return 0 if summary["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
