"""Benchmark: seconds per kernel page of ``kernel-lsp report`` on the recorded H200 zoo profiles.

Run: ``.venv/bin/python benchmarks/report_speed.py [--attempts 3] [--repeats 3] [--json benchmarks/results/report_speed.json]``

``tests/fixtures/ncu/programs/zoo.cu`` with its recorded full profiles
(``tests/fixtures/ncu/dataset/zoo_full.csv.gz``, 18 kernels with a roofline and stall reasons), each kernel
given ``--attempts`` optimization attempts (one accepted, one slower, one failed: the history chart), written
by :func:`kernel_lsp.services.report.write_reports` into a temporary folder, as ``kernel-lsp report`` writes
them. Each page is timed on its own (wall clock, ``time.perf_counter``, and this process's CPU time,
``time.process_time``, which is what to compare on a shared, loaded machine). The first page of a run pays
for importing matplotlib and its fonts; the issue's target is the pages after it. ``--repeats`` runs, each
in a fresh process, so every run's first page is a cold one.

Prints a table (first page; later pages' mean, p90 and max; whole run) and writes every raw sample to the
JSON file with the machine, the date and the command.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ZOO = os.path.join(ROOT, "tests", "fixtures", "ncu", "programs", "zoo.cu")
ZOO_CSV = os.path.join(ROOT, "tests", "fixtures", "ncu", "dataset", "zoo_full.csv.gz")
OUTCOMES = (("warp-shuffle-reduction", 1.84, True, "accepted"), ("block-size-tuning", 0.97, False, "slower"),
            ("thread-coarsening", None, False, "incorrect"))


def one_run(attempts_per_kernel: int) -> dict:
    """One cold run in this process: seconds per page, in page order."""
    started = time.perf_counter()
    sys.path.insert(0, ROOT)
    from kernel_lsp.core.kb_logic import Attempt
    from kernel_lsp.services import report
    from kernel_lsp.services.ncu_reader import parse_raw_csv, to_profiles

    with gzip.open(ZOO_CSV, "rt", encoding="utf-8") as f:
        profiles: dict = {}
        for profile in to_profiles(parse_raw_csv(f.read())):
            profiles.setdefault(profile.kernel, profile)
    attempts = [Attempt(kernel_hash="k", file=ZOO, kernel=kernel, state="s", technique=technique,
                        candidate_hash=f"{kernel}.{n}", verdict=verdict, accepted=accepted, speedup=speedup,
                        generator="rule:benchmark", created_at="2026-01-01T00:00:00Z")
                for kernel in profiles
                for n, (technique, speedup, accepted, verdict) in enumerate(OUTCOMES[:attempts_per_kernel])]
    with open(ZOO, encoding="utf-8") as f:
        source = f.read()
    wall: list[float] = []
    cpu: list[float] = []
    draw = report.kernel_page

    def timed(page_report):  # noqa: ANN001, ANN202 - a KernelReport in, the page out
        wall_start, cpu_start = time.perf_counter(), time.process_time()
        page = draw(page_report)
        wall.append(time.perf_counter() - wall_start)
        cpu.append(time.process_time() - cpu_start)
        return page

    report.kernel_page = timed
    with tempfile.TemporaryDirectory() as out:
        result = report.write_reports(ZOO, source, out, profiles=profiles, attempts=attempts)
        page_bytes = sum(os.path.getsize(p) for p in result.pages.values())
    return {"pages": len(wall), "wall_s": wall, "cpu_s": cpu, "page_bytes": page_bytes,
            "run_wall_s": time.perf_counter() - started}


def _summary(samples: list[float]) -> tuple[float, float, float]:
    ordered = sorted(samples)
    return statistics.fmean(ordered), ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], ordered[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=3, help="attempts per kernel in the history (0-3, default 3)")
    parser.add_argument("--repeats", type=int, default=3, help="cold runs, each in a fresh process (default 3)")
    parser.add_argument("--json", help="write the raw samples here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(one_run(args.attempts)))
        return 0
    runs = []
    for _ in range(args.repeats):
        child = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--attempts", str(args.attempts)],
                               capture_output=True, text=True, check=True)
        runs.append(json.loads(child.stdout))
    print(f"{'run':>3} {'pages':>5} {'first s':>8} {'later mean s':>12} {'p90 s':>6} {'max s':>6} "
          f"{'later mean cpu s':>16} {'run s':>6}")
    for i, run in enumerate(runs, 1):
        mean, p90, top = _summary(run["wall_s"][1:])
        cpu_mean = statistics.fmean(run["cpu_s"][1:])
        print(f"{i:>3} {run['pages']:>5} {run['wall_s'][0]:>8.3f} {mean:>12.3f} {p90:>6.3f} {top:>6.3f} "
              f"{cpu_mean:>16.3f} {run['run_wall_s']:>6.2f}")
    if args.json:
        data = {"machine": platform.platform(), "cpu_count": os.cpu_count(), "load_avg": os.getloadavg(),
                "python": platform.python_version(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                "command": " ".join(sys.argv), "unit": "s per kernel page", "attempts_per_kernel": args.attempts,
                "runs": runs}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
