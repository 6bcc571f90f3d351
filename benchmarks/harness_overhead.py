"""Wall time of one verification per manifest entry at default settings (GPU).

    python benchmarks/harness_overhead.py [--out benchmarks/results/harness_overhead.json] [--repeat 1] [--only EXAMPLE]

Targets (issue 24, with timed launches checked, a second timed series on redrawn inputs and
sizes the spec does not name tried): median verification <= 3 s per candidate, the slowest
<= 10 s, and the hanging candidate's verification (an entry expecting ``timeout``) <= 10 s.
Entries marked ``needs_sanitize`` run with ``--sanitize`` (their cheat is only visible to
compute-sanitizer); the table says which. All entries run in this one process, in manifest
order, as a search would: entries that share an original reuse its compiled cubin.

Prints a table (entry, verdict, expected?, wall seconds, sizes tried, timed launches checked,
speedup) and writes JSON with the machine, the date, the command, ``rows`` (one per
verification: ``name``, ``wall_s``, ``sanitize``, ``sizes_tried`` (how many sizes the spec does
not name were tried), ``timed_checks``, the reason and whether it was expected), the summary
(median, max, the hang case) and every verdict in full. Exits 1 when a verdict differs from
the manifest's expectation or a target is missed, so the table doubles as the end-to-end
check where pytest is not installed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from kernel_lsp.core.spec import with_candidate_launch  # noqa: E402
from kernel_lsp.services.toolchain import BuildFlags  # noqa: E402
from kernel_lsp.services.harness import VerifyOptions, load_spec_file, verify  # noqa: E402

EXAMPLES = os.path.join(os.path.dirname(HERE), "examples")
TARGET_MEDIAN_S = 3.0
TARGET_MAX_S = 10.0
TARGET_HANG_S = 10.0


def _read(rel: str) -> str:
    with open(os.path.join(EXAMPLES, rel), encoding="utf-8") as f:
        return f.read()


def _write(path: str, result: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(HERE, "results", "harness_overhead.json"))
    parser.add_argument("--repeat", type=int, default=1, help="verifications per entry")
    parser.add_argument("--only", help="run only this example's entries")
    args = parser.parse_args()
    with open(os.path.join(EXAMPLES, "manifest.json"), encoding="utf-8") as f:
        manifest = [e for e in json.load(f) if args.only in (None, e["example"])]
    rows, verdicts = [], []
    print(f"{'entry':62s} {'verdict':17s} {'expected':8s} {'wall s':>7s} {'sizes':>5s} {'timed':>5s} {'speedup':>8s}  first error", flush=True)
    for entry in manifest:
        spec = load_spec_file(os.path.join(EXAMPLES, entry["spec"]))
        if entry.get("candidate_launch"):
            spec = with_candidate_launch(spec, entry["candidate_launch"])
        sanitize = bool(entry.get("needs_sanitize"))
        options = VerifyOptions(sanitize=sanitize, build=BuildFlags(flags=("-I", os.path.join(EXAMPLES, entry["example"]))))
        name = f"{entry['candidate']} [{os.path.basename(entry['spec'])}]"
        for _ in range(args.repeat):
            verdict = verify(_read(entry["original"]), _read(entry["candidate"]), spec, options)
            expected = verdict.reason.value in entry["expect"]["reason"] and verdict.accepted == entry["expect"]["accepted"]
            row = {"name": name, "wall_s": verdict.wall_s, "sanitize": sanitize, "reason": verdict.reason.value,
                   "expected": entry["expect"]["reason"], "as_expected": expected, "speedup": verdict.speedup,
                   "sizes_tried": len(verdict.sizes_tried), "timed_checks": verdict.timed_checks,
                   "hang_case": entry["expect"]["reason"] == ["timeout"]}
            rows.append(row)
            verdicts.append({"name": name, "verdict": verdict.to_json()})
            error = verdict.errors[0].splitlines()[0][:100] if verdict.errors else ""
            shown = "" if verdict.speedup is None else f"{verdict.speedup:8.2f}"
            print(f"{name + (' +sanitize' if sanitize else ''):62s} {row['reason']:17s} {'yes' if expected else 'NO':8s} "
                  f"{verdict.wall_s:7.2f} {row['sizes_tried']:5d} {verdict.timed_checks or 0:5d} {shown:>8s}  {error}", flush=True)
            # Rows so far, after every verification: a run stopped by a time limit still leaves them.
            _write(args.out, {"benchmark": "harness_overhead", "partial": True, "rows": rows})
    walls = [r["wall_s"] for r in rows]
    hangs = [r for r in rows if r["hang_case"]]
    unexpected = [r["name"] for r in rows if not r["as_expected"]]
    summary = {
        "verifications": len(rows),
        "median_wall_s": statistics.median(walls) if walls else None,
        "max_wall_s": max(walls) if walls else None,
        "median_wall_s_without_sanitize": statistics.median([r["wall_s"] for r in rows if not r["sanitize"]]) if any(not r["sanitize"] for r in rows) else None,
        "hang": [{"name": r["name"], "wall_s": r["wall_s"], "reason": r["reason"]} for r in hangs],
        "sizes_tried_total": sum(r["sizes_tried"] for r in rows),
        "target_median_s": TARGET_MEDIAN_S,
        "target_max_s": TARGET_MAX_S,
        "target_hang_s": TARGET_HANG_S,
        "unexpected": unexpected,
    }
    misses = []
    if walls and summary["median_wall_s"] > TARGET_MEDIAN_S:
        misses.append(f"median {summary['median_wall_s']:.2f} s > {TARGET_MEDIAN_S} s")
    if walls and summary["max_wall_s"] > TARGET_MAX_S:
        slowest = max(rows, key=lambda r: r["wall_s"])
        misses.append(f"slowest {slowest['name']} {slowest['wall_s']:.2f} s > {TARGET_MAX_S} s")
    misses += [f"hang case {h['name']} took {h['wall_s']:.2f} s > {TARGET_HANG_S} s" for h in summary["hang"] if h["wall_s"] > TARGET_HANG_S]
    summary["targets_missed"] = misses
    if walls:
        print(f"median {summary['median_wall_s']:.2f} s (target {TARGET_MEDIAN_S:.0f} s), max {summary['max_wall_s']:.2f} s "
              f"(target {TARGET_MAX_S:.0f} s), {summary['sizes_tried_total']} sizes tried, "
              f"{len(rows)} verifications; hang case: "
              + (", ".join(f"{h['name']} {h['reason']} in {h['wall_s']:.2f} s" for h in summary["hang"]) or "none")
              + f" (target {TARGET_HANG_S:.0f} s); unexpected verdicts: {len(unexpected)}")
    for miss in misses:
        print(f"TARGET MISSED: {miss}")
    gpu = next((v["verdict"]["gpu"] for v in verdicts if v["verdict"].get("gpu")), None)
    result = {
        "benchmark": "harness_overhead",
        "machine": {"host": platform.node(), "python": platform.python_version(), "gpu": gpu},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "command": " ".join([sys.executable, *sys.argv]),
        "summary": summary,
        "rows": rows,
        "verdicts": verdicts,
    }
    _write(args.out, result)
    print(f"wrote {args.out}")
    return 1 if unexpected or misses else 0


if __name__ == "__main__":
    sys.exit(main())
