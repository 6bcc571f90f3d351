"""Optimizer benchmark over the real-code corpus (``benchmarks/corpus/``), rules only.

For every corpus kernel: ``kernel-lsp optimize``'s own search (the same :class:`Session` the
editor uses, rules in their default order, no knowledge base so two runs propose the same
candidates), each candidate verified by the harness on this machine's GPU. Per kernel: the
baseline time, its floor, the best verified speedup and its transformation sequence, the
candidates tried and the wall time. Overall: the share of non-control kernels improved, the
geometric mean over all kernels (a kernel without an accepted candidate counts 1.0x), the
share at least 1.2x faster, and controls slowed (an accepted candidate is at least 1.05x by
the harness's interval, so this counts controls whose best verified speedup is below 1.0).

    PYTHONPATH=. python3 benchmarks/corpus_suite.py --out $OUT/corpus_suite.json \\
        [--baseline corpus_baseline.json] [--budget 8] [--max-seconds 120] [--shard 1/2] [--only A,B]
        [--heldout | --no-heldout] [--skip done.json] [--dry-run]
    python3 benchmarks/corpus_suite.py --merge a.json b.json [rerun.json] --out benchmarks/results/corpus_suite.json

``--corpus benchmarks/outside`` runs the kernels from outside the corpus instead (the same layout).
``--baseline`` takes ``benchmarks/corpus_baseline.py``'s results for the kernels where no
candidate was timed (their baseline is then that program's median). ``--shard K/N`` runs every
N-th kernel from the K-th, so a run can be split over several calls; ``--skip a.json`` leaves out the
kernels a cut-off call already measured; ``--merge`` joins shards (a kernel in a later file replaces
its row from an earlier one). ``--heldout`` runs only the
entries whose spec notes say ``"heldout": true`` (kernels added after the transformations were
written, so that none was designed against them), ``--no-heldout`` only the others; both combine
with ``--only`` and ``--shard``. ``--dry-run`` needs no GPU: the search lists its candidates
without verifying any (no speedup is measured; the file says ``"dry_run": true``), which checks
that every selected kernel goes through the optimizer.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import corpus_baseline  # noqa: E402
from corpus_baseline import entries, floor_us, gpu_name, load_spec  # noqa: E402

from kernel_lsp.config import Settings  # noqa: E402
from kernel_lsp.services.optimizer import Budget  # noqa: E402
from kernel_lsp.services.session import Session  # noqa: E402

CORPUS = ROOT / "benchmarks" / "corpus"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "corpus_suite.json"


def use_corpus(folder: Path) -> None:
    """Read the entries from ``folder`` instead of ``benchmarks/corpus``, here and in corpus_baseline."""
    global CORPUS
    CORPUS = folder
    corpus_baseline.CORPUS = str(folder)


def suite_of(name: str) -> str:
    """The source suite of a corpus entry: its folder is named ``suite_kernel``."""
    return name.split("_", 1)[0]


def is_heldout(notes: dict[str, Any] | None) -> bool:
    return bool((notes or {}).get("heldout"))


def select(names: list[str], heldout: bool | None) -> list[str]:
    """``names`` whose notes say held out (``heldout`` True), or not (False), or all (None)."""
    if heldout is None:
        return names
    return [n for n in names if is_heldout(load_spec(n).notes) == heldout]


def run_kernel(name: str, budget: Budget, baseline: dict[str, Any], scratch: str, verify: bool = True) -> dict[str, Any]:
    spec = load_spec(name)
    path = str(CORPUS / name / "kernel.cu")
    source = Path(path).read_text(encoding="utf-8")
    notes = spec.notes or {}
    floor, _bound, _bytes, _flops = floor_us(spec)
    session = Session(Settings(kb_path=os.path.join(scratch, "kb.sqlite")), workspace_root=str(ROOT), use_kb=False)
    start = time.monotonic()
    result = session.optimize(source, path, spec.kernel, spec, budget=budget, verify=verify)
    wall = time.monotonic() - start
    candidates = [r.to_json() for r in result.results]
    best = result.best
    best_speedup = best.verdict.speedup if best is not None and best.verdict and best.verdict.speedup else 1.0
    timed = [r.verdict.timings["original"].median_ms for r in result.results
             if r.verdict is not None and "original" in r.verdict.timings]
    base = baseline.get(name)
    baseline_us = (sorted(timed)[len(timed) // 2] * 1000.0) if timed else (base.get("median_us") if base else None)
    # Each step's variant (``[unroll]``, ``[block=128]``) is left out of the sequence's technique names.
    sequence = re.sub(r"\[[^\]]*\]", "", best.candidate.generator.split(":", 1)[1]).split("+") if best is not None else []
    return {
        "name": name,
        "suite": suite_of(name),
        "kernel": spec.kernel,
        "category": notes.get("category"),
        "control": bool(notes.get("control")),
        "heldout": is_heldout(notes),
        "baseline_us": baseline_us,
        "baseline_from": "harness" if timed else ("corpus_baseline" if base else None),
        "floor_us": floor,
        "best_speedup": best_speedup,
        "best_interval": [best.verdict.speedup_ci_low, best.verdict.speedup_ci_high] if best is not None and best.verdict else None,
        "sequence": sequence,
        "candidates": len(result.results),
        "wall_s": wall,
        "stopped": result.stopped,
        "gpu_error": result.gpu_error,
        "tried": [{"generator": c["generator"], "technique": c["technique"], "status": c["status"], "note": c["note"],
                   "speedup": (c["verdict"] or {}).get("speedup"), "reason": (c["verdict"] or {}).get("reason"),
                   "first_error": ((c["verdict"] or {}).get("errors") or [None])[0], "wall_s": c["wall_s"]}
                  for c in candidates],
    }


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    non_controls = [r for r in rows if not r["control"]]
    controls = [r for r in rows if r["control"]]
    improved = [r for r in non_controls if r["best_speedup"] > 1.0 and r["sequence"]]
    geomean = math.exp(sum(math.log(max(r["best_speedup"], 1e-9)) for r in rows) / len(rows)) if rows else None
    return {
        "kernels": len(rows),
        "non_controls": len(non_controls),
        "non_controls_improved": len(improved),
        "improved_share": len(improved) / len(non_controls) if non_controls else None,
        "geomean_speedup": geomean,
        "fast_1_2_share": sum(1 for r in rows if r["best_speedup"] >= 1.2) / len(rows) if rows else None,
        "controls": len(controls),
        "controls_slowed": sum(1 for r in controls if r["best_speedup"] < 1.0),
        "controls_improved": sum(1 for r in controls if r["sequence"]),
        "candidates": sum(r["candidates"] for r in rows),
        "wall_s": sum(r["wall_s"] for r in rows),
    }


def print_table(rows: list[dict[str, Any]], total: dict[str, Any]) -> None:
    print(f"{'kernel':38s} {'ctrl':4s} {'base us':>10s} {'floor us':>10s} {'best':>7s} {'cand':>4s} {'wall s':>7s}  sequence")
    for r in rows:
        base = f"{r['baseline_us']:10.1f}" if r["baseline_us"] is not None else f"{'-':>10s}"
        floor = f"{r['floor_us']:10.1f}" if r["floor_us"] is not None else f"{'-':>10s}"
        print(f"{r['name']:38s} {'yes' if r['control'] else '':4s} {base} {floor} {r['best_speedup']:6.2f}x {r['candidates']:4d} "
              f"{r['wall_s']:7.1f}  {'+'.join(r['sequence']) or '-'}")
    print(f"non-controls improved {total['non_controls_improved']}/{total['non_controls']}, geomean {total['geomean_speedup']:.3f}x, "
          f"fast_1.2 {total['fast_1_2_share']:.2%}, controls slowed {total['controls_slowed']}/{total['controls']}, "
          f"{total['candidates']} candidates in {total['wall_s']:.0f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help=f"results file (default {DEFAULT_OUT.relative_to(ROOT)}; a dry run must name one)")
    parser.add_argument("--corpus", default=None,
                        help="another folder of entries laid out as the corpus (benchmarks/outside: kernels from "
                             "outside the corpus, tried as a new user would)")
    parser.add_argument("--only", default="", help="comma-separated corpus entries (default: all)")
    parser.add_argument("--budget", type=int, default=8, help="candidates verified per kernel (at most)")
    parser.add_argument("--max-seconds", type=float, default=120.0, help="wall time per kernel after which no candidate starts (the one being verified finishes)")
    parser.add_argument("--baseline", default=None, help="corpus_baseline.py results for kernels without a timed candidate")
    parser.add_argument("--shard", default="1/1", help="K/N: every N-th kernel from the K-th")
    parser.add_argument("--merge", nargs="+", default=None, help="join shard results into --out")
    parser.add_argument("--skip", nargs="+", default=(), metavar="RESULTS",
                        help="results files whose kernels are not run again (a run continued after a call was cut off)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--heldout", dest="heldout", action="store_const", const=True, default=None,
                       help="only the entries whose notes say heldout (added after the transformations were written)")
    which.add_argument("--no-heldout", dest="heldout", action="store_const", const=False,
                       help="only the entries that are not held out")
    parser.add_argument("--dry-run", action="store_true",
                        help="no GPU: list every kernel's candidates without verifying them (nothing is measured)")
    args = parser.parse_args(argv)
    if args.out is None:
        if args.dry_run:
            parser.error("--dry-run needs --out: the default is the committed results file, which a dry run must not replace")
        args.out = str(DEFAULT_OUT)
    if args.merge:
        parts = [json.loads(Path(p).read_text()) for p in args.merge]
        # A kernel in a later file replaces the same kernel in an earlier one (a re-run after a fix).
        by_name = {r["name"]: r for p in parts for r in p["kernels"]}
        rows = sorted(by_name.values(), key=lambda r: r["name"])
        total = summary(rows)
        # A merged file merged again keeps one flat list of the runs behind it.
        commands = [c for p in parts for c in (p["command"] if isinstance(p["command"], list) else [p["command"]])]
        sources = [s for p, name in zip(parts, args.merge)
                   for s in (p["merged_from"] if "merged_from" in p else [os.path.basename(name)])]
        merged = {**parts[0], "kernels": rows, "summary": total, "command": commands, "merged_from": sources}
        Path(args.out).write_text(json.dumps(merged, indent=1) + "\n")
        print_table(rows, total)
        return 0
    if args.corpus:
        use_corpus(Path(args.corpus).resolve())
    k, n = (int(x) for x in args.shard.split("/"))
    names = select(entries({x.strip() for x in args.only.split(",") if x.strip()} or None), args.heldout)[k - 1 :: n]
    done = {r["name"] for p in args.skip for r in json.loads(Path(p).read_text())["kernels"]}
    names = [name for name in names if name not in done]
    baseline = {r["name"]: r for r in json.loads(Path(args.baseline).read_text())["kernels"]} if args.baseline else {}
    budget = Budget(max_candidates=args.budget, max_seconds=args.max_seconds)
    rows: list[dict[str, Any]] = []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="corpus-suite-") as scratch:
        for name in names:
            try:
                row = run_kernel(name, budget, baseline, scratch, verify=not args.dry_run)
            except Exception as exc:  # one kernel's failure is a row, not the end of the run
                notes = load_spec(name).notes
                row = {"name": name, "suite": suite_of(name), "control": bool((notes or {}).get("control")),
                       "heldout": is_heldout(notes), "baseline_us": None, "floor_us": None, "best_speedup": 1.0,
                       "sequence": [], "candidates": 0, "wall_s": 0.0, "error": f"{type(exc).__name__}: {exc}"}
            rows.append(row)
            print(f"{name:38s} {row['best_speedup']:6.2f}x {'+'.join(row['sequence']) or '-':40s} "
                  f"{row['candidates']} candidates, {row['wall_s']:.1f} s" + (f"  ERROR {row['error']}" if "error" in row else ""),
                  flush=True)
            result = {
                "machine": {"host": platform.node(), "python": platform.python_version(), "gpu": gpu_name()},
                "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
                "budget": {"max_candidates": args.budget, "max_seconds": args.max_seconds},
                "dry_run": args.dry_run,
                "units": "baseline_us and floor_us in microseconds; wall_s in seconds",
                "kernels": rows,
                "summary": summary(rows),
            }
            # Written after every kernel: a run cut short keeps what it measured.
            out.write_text(json.dumps(result, indent=1) + "\n")
    print_table(rows, summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
