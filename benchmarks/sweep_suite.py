"""Sweep benchmark on the GPU machine: the corpus swept with ``--engine ray`` on one GPU, against single runs.

Two measurements of the same kernels (``benchmarks/corpus/``, each entry's ``spec.json`` laid beside a copy of
its ``kernel.cu`` as the sidecar a sweep finds), the knowledge base off in both so both propose the same
candidates:

1. **single runs**: each kernel optimized on its own through the session (``kernel-lsp optimize``'s search),
   one after another in this process; their wall times are summed;
2. **the sweep**: :func:`kernel_lsp.services.sweep.run_sweep` with the Ray engine on a Ray cluster of this
   machine with one GPU (started here; its start is timed apart), one task per kernel with ``num_gpus=1``,
   into a fresh sweep folder (nothing kept from before); then the same sweep again, which finds every
   outcome kept (the cost of a resumed sweep with nothing left to do).

Reported: the sweep's wall time against the sum of the single runs, the overhead per kernel
((sweep wall - single sum) / kernels), each task's own wall time against its single run (what Ray's
task start and the session's set-up inside a worker add), discovery time, and whether the two agree on
each kernel's outcome and technique (timing noise may flip a borderline one).

    PYTHONPATH=. python3 benchmarks/sweep_suite.py --out $OUT/sweep_suite.json [--only A,B] [--budget 3]
        [--max-seconds 60] [--single-only | --single-from earlier.json]

``--single-only`` makes the single runs alone and writes them; ``--single-from`` then takes them from
that result (same kernels and budget), so the two halves fit separate commands.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from corpus_baseline import entries, gpu_name, load_spec  # noqa: E402

from kernel_lsp.services import sweep  # noqa: E402
from kernel_lsp.services.sweep import SweepOptions, discover, run_sweep  # noqa: E402

CORPUS = ROOT / "benchmarks" / "corpus"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "sweep_suite.json"


def lay_out(names: list[str], scratch: Path) -> Path:
    """The corpus copied to ``scratch/src`` (shared headers included), each spec as its kernel's sidecar."""
    src = scratch / "src"
    shutil.copytree(CORPUS, src, ignore=shutil.ignore_patterns("README.md", "ORIGIN"))
    for folder in src.iterdir():
        if folder.is_dir() and not folder.name.startswith("_") and folder.name not in names:
            shutil.rmtree(folder)
    for name in names:
        spec = load_spec(name)
        shutil.copy(CORPUS / name / "spec.json", src / name / f"kernel.cu.{spec.kernel}.spec.json")
    return src


def single_runs(jobs: list[sweep.KernelJob], options: SweepOptions) -> dict[str, dict[str, Any]]:
    """Each kernel optimized alone through the session, one after another: the baseline the sweep is weighed against."""
    rows = {}
    for job in jobs:
        session = options.session()
        start = time.monotonic()
        result = session.optimize(job.source, job.path, job.kernel, job.spec, budget=options.budget(),
                                  verify_overrides=options.verify_overrides(), seed=options.seed)
        wall = time.monotonic() - start
        best = result.best
        rows[job.rel] = {"kernel": job.kernel, "wall_s": wall, "candidates": len(result.results),
                         "status": "accepted" if best else ("no-gpu" if result.gpu_error else "none-faster"),
                         "technique": best.candidate.technique if best else None,
                         "speedup": best.verdict.speedup if best and best.verdict else None}
        print(f"single {job.rel:50s} {rows[job.rel]['status']:12s} {wall:7.1f} s", flush=True)
    return rows


def write(args: argparse.Namespace, rows: list[dict[str, Any]], total: dict[str, Any]) -> None:
    import ray

    result = {
        "machine": {"host": platform.node(), "python": platform.python_version(), "gpu": gpu_name(),
                    "ray": ray.__version__, "cpus": os.cpu_count()},
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "budget": {"max_candidates": args.budget, "max_seconds": args.max_seconds},
        "units": "every *_s in seconds",
        "kernels": rows, "summary": total,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--only", default="", help="comma-separated corpus entries (default: all)")
    parser.add_argument("--budget", type=int, default=3, help="candidates verified per kernel (at most)")
    parser.add_argument("--max-seconds", type=float, default=60.0, help="wall time per kernel (at most)")
    parser.add_argument("--single-from", help="take the single runs from this earlier result")
    parser.add_argument("--single-only", action="store_true", help="make and write the single runs only")
    args = parser.parse_args(argv)
    names = entries({x.strip() for x in args.only.split(",") if x.strip()} or None)
    import ray

    with tempfile.TemporaryDirectory(prefix="sweep-suite-") as tmp:
        scratch = Path(tmp)
        src = lay_out(names, scratch)
        options = SweepOptions(out_dir=str(scratch / "sweep"), workspace_root=str(src), use_kb=False,
                               budget_candidates=args.budget, budget_s=args.max_seconds)
        start = time.monotonic()
        found = discover([str(src)], options)
        discovery_s = time.monotonic() - start
        jobs = list(found.jobs)
        if args.single_from:
            single = {r["rel"]: r["single"] for r in json.loads(Path(args.single_from).read_text())["kernels"]}
        else:
            single = single_runs(jobs, options)
        if args.single_only:
            write(args, [{"rel": rel, "kernel": row["kernel"], "single": row} for rel, row in single.items()],
                  {"kernels": len(single), "single_sum_s": sum(r["wall_s"] for r in single.values())})
            return 0

        start = time.monotonic()
        # The kernel-lsp of this checkout in Ray's workers, as in this process.
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        ray.init(num_gpus=1, include_dashboard=False, logging_level="WARNING", configure_logging=False)
        ray_start_s = time.monotonic() - start
        try:
            start = time.monotonic()
            report = run_sweep(found, options, engine="ray")
            sweep_s = time.monotonic() - start
            start = time.monotonic()
            resumed = run_sweep(discover([str(src)], options), options, engine="ray")
            resumed_s = time.monotonic() - start
        finally:
            ray.shutdown()

    rows = []
    for outcome in report.outcomes:
        alone = single.get(outcome.rel) or {}
        rows.append({
            "rel": outcome.rel, "kernel": outcome.kernel,
            "single": alone,
            "sweep": {"status": outcome.status, "technique": outcome.technique, "speedup": outcome.speedup,
                      "candidates": outcome.candidates, "task_wall_s": outcome.wall_s, "gpu": outcome.gpu},
            "task_overhead_s": outcome.wall_s - alone["wall_s"] if alone.get("wall_s") is not None else None,
            "agree": (alone.get("status"), alone.get("technique")) == (outcome.status, outcome.technique),
        })
    single_sum = sum(r["single"].get("wall_s") or 0.0 for r in rows)
    n = len(rows)
    total = {
        "kernels": n, "accepted": len(report.accepted),
        "single_sum_s": single_sum, "sweep_wall_s": sweep_s, "ray_start_s": ray_start_s, "discovery_s": discovery_s,
        "resumed_sweep_wall_s": resumed_s, "resumed_ran": resumed.ran,
        "overhead_per_kernel_s": (sweep_s - single_sum) / n if n else None,
        "task_overhead_mean_s": (sum(r["task_overhead_s"] for r in rows if r["task_overhead_s"] is not None) / n) if n else None,
        "agree": sum(1 for r in rows if r["agree"]),
    }
    write(args, rows, total)
    print(f"{'kernel':50s} {'single s':>9s} {'task s':>8s} {'over s':>7s}  outcome (single / sweep)")
    for r in rows:
        alone = r["single"]
        over = f"{r['task_overhead_s']:7.2f}" if r["task_overhead_s"] is not None else f"{'-':>7s}"
        print(f"{r['rel'] + ':' + r['kernel']:50s} {alone.get('wall_s', 0.0):9.1f} {r['sweep']['task_wall_s']:8.1f} {over}  "
              f"{alone.get('status')}/{r['sweep']['status']} {r['sweep']['technique'] or ''}")
    print(f"{n} kernels: single runs {single_sum:.1f} s, sweep {sweep_s:.1f} s (+ Ray start {ray_start_s:.1f} s, "
          f"discovery {discovery_s:.1f} s), overhead {total['overhead_per_kernel_s'] or 0:.2f} s per kernel; "
          f"resumed sweep {resumed_s:.1f} s ran {resumed.ran}; {total['agree']}/{n} outcomes agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
