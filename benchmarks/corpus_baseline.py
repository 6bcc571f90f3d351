"""Baseline time and roofline floor of every real-code corpus kernel (GPU).

    PYTHONPATH=. python3 benchmarks/corpus_baseline.py --out $OUT/corpus_baseline.json
        [--only NAME[,NAME...]] [--write-notes] [--dry-run] [--timeout-s 120] [--min-trials 20]
    PYTHONPATH=. python3 benchmarks/corpus_baseline.py --notes-from corpus_baseline.json

For each ``benchmarks/corpus/NAME/``: compile ``kernel.cu`` for ``--arch``
(nvcc, ``-I`` the entry's folder) and find the kernel's entry; then, in a child
process of its own (a fault or a hang costs that kernel only, bounded by
``--timeout-s``), draw the spec's inputs (seed 0, main size), and time the
launch with the harness's own timer (``PycudaBackend.timer``: out/inout arrays
restored and L2 flushed before every launch, CUDA events around it): a few
warm-up launches, then at least ``--min-trials`` timed ones, more while the
per-kernel budget lasts.

The floor is the spec note's compulsory traffic at DRAM bandwidth,
``bytes_min / 4.3e12 s``; where the note gives ``flops``, the larger of that and
``flops / 67e12 s`` (H200 FP32 without tensor cores). All times in microseconds.

Prints a table (name, category, control, median µs, floor µs, ratio) and
writes JSON with the machine, the date, the command and every raw sample.
``--write-notes`` writes ``baseline_us``, ``floor_us`` and ``baseline_gpu``
into each measured spec's ``notes``; ``--notes-from RESULTS.json`` does the same
from a results file measured elsewhere (the GPU machine's copy of the specs is
not the one kept). ``--dry-run`` needs no GPU: it compiles
every kernel and builds its inputs in the child, so the whole plan is checked
on a CPU machine. Exit status 1 when some kernel failed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from kernel_lsp.core import expr  # noqa: E402
from kernel_lsp.core.spec import FLOAT_TYPES, ArrayParam, Spec, parse_spec  # noqa: E402
from kernel_lsp.services.toolchain import BuildFlags  # noqa: E402
from kernel_lsp.services.harness.compile import compile_cubin, find_entry  # noqa: E402
from kernel_lsp.services.proc import ToolMissing, run  # noqa: E402

CORPUS = os.path.join(HERE, "corpus")
DRAM_BYTES_PER_S = 4.3e12
"""H200 HBM3e bandwidth the floors are computed at."""
FP32_FLOPS_PER_S = 67e12
"""H200 FP32 (CUDA cores) peak the compute floors are computed at."""
WARMUP_LAUNCHES = 3
MAX_TRIALS = 200
TRIAL_BUDGET_S = 0.5
"""Timed launches continue past ``--min-trials`` until this much wall time per kernel."""


def gpu_name() -> str | None:
    """The first GPU's name as nvidia-smi gives it; None without one (or without nvidia-smi)."""
    try:
        out = run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], timeout_s=30)
    except ToolMissing:
        return None
    return out.stdout.strip().splitlines()[0] if out.ok and out.stdout.strip() else None


def entries(only: set[str] | None) -> list[str]:
    names = sorted(n for n in os.listdir(CORPUS) if not n.startswith("_") and os.path.isfile(os.path.join(CORPUS, n, "spec.json")))
    if only:
        unknown = only - set(names)
        if unknown:
            raise SystemExit(f"corpus_baseline: no corpus entry named {', '.join(sorted(unknown))}")
        names = [n for n in names if n in only]
    return names


def load_spec(name: str) -> Spec:
    path = os.path.join(CORPUS, name, "spec.json")
    with open(path, encoding="utf-8") as f:
        return parse_spec(json.load(f), os.path.dirname(path))


def _note_value(value: object, spec: Spec) -> float | None:
    """A note's number, or its integer expression evaluated at the spec's main values."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    env = {p.name: int(p.value) for p in spec.scalars if p.type not in FLOAT_TYPES}
    return float(expr.evaluate(str(value), env))


def floor_us(spec: Spec) -> tuple[float | None, str, float | None, float | None]:
    """(floor µs, which bound sets it, bytes_min, flops) from the spec's notes."""
    notes = spec.notes or {}
    bytes_min = _note_value(notes.get("bytes_min"), spec)
    flops = _note_value(notes.get("flops"), spec)
    bounds = []
    if bytes_min is not None:
        bounds.append((1e6 * bytes_min / DRAM_BYTES_PER_S, "dram"))
    if flops is not None:
        bounds.append((1e6 * flops / FP32_FLOPS_PER_S, "fp32"))
    if not bounds:
        return None, "none", bytes_min, flops
    value, kind = max(bounds)
    return value, kind, bytes_min, flops


# --- the child: one kernel, one process ---------------------------------------------------------

def child(job_path: str, result_path: str) -> int:
    with open(job_path, encoding="utf-8") as f:
        job = json.load(f)
    result: dict = {"status": "error"}
    try:
        result = _child_job(job)
    except Exception as exc:  # noqa: BLE001 - reported to the parent as this kernel's failure
        result = {"status": "error", "message": f"{type(exc).__name__}: {exc}"}
    with open(result_path, "w", encoding="utf-8") as f:
        json.dump(result, f)
    return 0


def _child_job(job: dict) -> dict:
    from kernel_lsp.core.inputs import make_inputs
    from kernel_lsp.services.harness.child import load_files, smi_clocks
    from kernel_lsp.services.harness.protocol import ORIGINAL, build_args

    spec = load_spec(job["name"])
    start = time.perf_counter()
    args = build_args(spec, make_inputs(spec, 0, None, load_files(spec)), None)
    input_bytes = sum(a.nbytes for a in args if hasattr(a, "nbytes") and getattr(a, "ndim", 0) > 0)
    inputs_s = time.perf_counter() - start
    if job["dry_run"]:
        return {"status": "planned", "input_bytes": input_bytes, "inputs_s": inputs_s}
    from kernel_lsp.services.harness.backend_pycuda import GpuMissing, PycudaBackend

    try:
        backend = PycudaBackend({ORIGINAL: (job["cubin"], job["entry"])})
    except GpuMissing as exc:
        return {"status": "no_gpu", "message": str(exc)}
    try:
        restore = [isinstance(p, ArrayParam) and p.role != "in" for p in spec.params]
        timer = backend.timer({ORIGINAL: args}, {ORIGINAL: spec.resolve(None).original}, restore)
        try:
            for _ in range(WARMUP_LAUNCHES):
                timer.time_ms(ORIGINAL)
            samples_us: list[float] = []
            begin = time.perf_counter()
            while len(samples_us) < MAX_TRIALS and (len(samples_us) < job["min_trials"] or time.perf_counter() - begin < TRIAL_BUDGET_S):
                samples_us.append(1000.0 * timer.time_ms(ORIGINAL))
        finally:
            timer.close()
        gpu = backend.info()
        gpu.update({k: v for k, v in smi_clocks().items() if v is not None})
    finally:
        try:
            backend.close()
        except Exception:  # noqa: BLE001 - a context broken by a fault cannot always be popped; the process ends anyway
            pass
    return {"status": "done", "samples_us": samples_us, "gpu": gpu, "input_bytes": input_bytes, "inputs_s": inputs_s}


# --- the parent ---------------------------------------------------------------------------------

def compile_entry(name: str, spec: Spec, workdir: str, arch: str) -> dict:
    folder = os.path.join(CORPUS, name)
    with open(os.path.join(folder, "kernel.cu"), encoding="utf-8") as f:
        source = f.read()
    os.makedirs(workdir, exist_ok=True)
    result = compile_cubin(source, workdir, "kernel", BuildFlags(flags=("-I", folder, "-O3")).for_arch(arch))
    if not result.ok:
        return {"status": "compile_error", "message": result.log[-2000:]}
    entry, problem = find_entry(result.entries, spec.kernel)
    if entry is None:
        return {"status": "compile_error", "message": problem}
    return {"status": "compiled", "cubin": result.cubin_path, "entry": entry, "compile_s": result.wall_s}


def measure_entry(name: str, compiled: dict, args: argparse.Namespace, workdir: str) -> dict:
    job_path, result_path = os.path.join(workdir, "job.json"), os.path.join(workdir, "result.json")
    with open(job_path, "w", encoding="utf-8") as f:
        json.dump({"name": name, "cubin": compiled["cubin"], "entry": compiled["entry"], "dry_run": args.dry_run, "min_trials": args.min_trials}, f)
    proc = run([sys.executable, os.path.abspath(__file__), "--child", job_path, result_path], timeout_s=args.timeout_s,
               env={"PYTHONPATH": os.path.dirname(HERE) + os.pathsep + os.environ.get("PYTHONPATH", "")})
    if proc.timed_out:
        return {"status": "timeout", "message": f"no result in {args.timeout_s:.0f} s"}
    if not os.path.exists(result_path):
        return {"status": "crashed", "message": f"exit {proc.returncode}: {(proc.stderr or proc.stdout)[-2000:]}"}
    with open(result_path, encoding="utf-8") as f:
        return json.load(f)


def write_notes(name: str, median_us: float, floor: float | None, gpu_name: str | None) -> None:
    path = os.path.join(CORPUS, name, "spec.json")
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    notes = data.setdefault("notes", {})
    notes["baseline_us"] = round(median_us, 3)
    notes["floor_us"] = None if floor is None else round(floor, 3)
    if gpu_name:
        notes["baseline_gpu"] = gpu_name
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
        f.write("\n")


def notes_from(results_path: str) -> int:
    """Write baseline_us/floor_us from a results file into the specs of this checkout."""
    with open(results_path, encoding="utf-8") as f:
        results = json.load(f)
    if results.get("dry_run"):
        raise SystemExit(f"corpus_baseline: {results_path} is a dry run; it has no times")
    gpu = (results.get("machine") or {}).get("gpu")
    gpu_name = gpu.get("name") if isinstance(gpu, dict) else gpu
    known = set(entries(None))
    written = 0
    for row in results["kernels"]:
        # This program's rows carry median_us; benchmarks/corpus_suite.py's carry the harness's baseline_us.
        median = row.get("median_us", row.get("baseline_us"))
        if median is not None and row["name"] in known:
            write_notes(row["name"], median, row.get("floor_us"), gpu_name)
            written += 1
    print(f"notes written for {written} of {len(results['kernels'])} kernels (GPU: {gpu_name})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="JSON results file (required unless --dry-run)")
    parser.add_argument("--only", default="", help="comma-separated corpus entries (default: all)")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="per kernel: inputs, timing and teardown")
    parser.add_argument("--min-trials", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1), help="parallel nvcc compiles")
    parser.add_argument("--write-notes", action="store_true", help="record baseline_us/floor_us in each spec's notes")
    parser.add_argument("--dry-run", action="store_true", help="compile and build inputs only (no GPU)")
    parser.add_argument("--notes-from", default=None, metavar="RESULTS", help="write the notes from a results JSON of an earlier run, then exit")
    parser.add_argument("--child", nargs=2, metavar=("JOB", "RESULT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(*args.child)
    if args.notes_from:
        return notes_from(args.notes_from)
    if not args.out and not args.dry_run:
        parser.error("--out is required (or --dry-run)")
    names = entries({n.strip() for n in args.only.split(",") if n.strip()} or None)
    specs = {n: load_spec(n) for n in names}
    started = time.perf_counter()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="corpus-baseline-") as scratch:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            compiled = dict(zip(names, pool.map(lambda n: compile_entry(n, specs[n], os.path.join(scratch, n), args.arch), names)))
        for name in names:
            spec = specs[name]
            floor, bound, bytes_min, flops = floor_us(spec)
            notes = spec.notes or {}
            resolved = spec.resolve(None)
            row = {"name": name, "kernel": spec.kernel, "category": notes.get("category"), "control": notes.get("control"),
                   "size": notes.get("size"), "grid": list(resolved.original.grid), "block": list(resolved.original.block),
                   "bytes_min": bytes_min, "flops": flops, "floor_us": floor, "floor_bound": bound}
            outcome = compiled[name]
            if outcome["status"] == "compiled":
                row.update(entry=outcome["entry"], compile_s=outcome["compile_s"])
                outcome = measure_entry(name, outcome, args, os.path.join(scratch, name))
            row["status"] = outcome.get("status")
            row["message"] = outcome.get("message")
            row["input_bytes"] = outcome.get("input_bytes")
            row["samples_us"] = outcome.get("samples_us", [])
            row["median_us"] = statistics.median(row["samples_us"]) if row["samples_us"] else None
            row["gpu"] = outcome.get("gpu")
            rows.append(row)
            ratio = f"{row['median_us'] / floor:8.1f}x" if row["median_us"] and floor else "        "
            median = f"{row['median_us']:12.2f}" if row["median_us"] is not None else f"{row['status']:>12}"
            floor_text = f"{floor:10.2f}" if floor is not None else "         -"
            print(f"{name:40s} {str(row['category']):20s} {'ctrl' if row['control'] else '    '} {median} {floor_text} {ratio}", flush=True)
            if row["status"] not in ("done", "planned"):
                print(f"    {row['status']}: {(row['message'] or '').strip().splitlines()[-1:] }", flush=True)
    gpu = next((r["gpu"] for r in rows if r.get("gpu")), None)
    if args.write_notes and not args.dry_run:
        for row in rows:
            if row["median_us"] is not None:
                write_notes(row["name"], row["median_us"], row["floor_us"], (gpu or {}).get("name"))
    failed = [r["name"] for r in rows if r["status"] not in ("done", "planned")]
    result = {
        "machine": {"host": platform.node(), "python": platform.python_version(), "gpu": gpu},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "dry_run": args.dry_run,
        "dram_bytes_per_s": DRAM_BYTES_PER_S,
        "fp32_flops_per_s": FP32_FLOPS_PER_S,
        "units": "samples_us, median_us and floor_us in microseconds; bytes_min in bytes",
        "wall_s": time.perf_counter() - started,
        "failed": failed,
        "kernels": rows,
    }
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    print(f"{len(rows) - len(failed)}/{len(rows)} kernels {'planned' if args.dry_run else 'measured'} in {result['wall_s']:.0f} s" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
