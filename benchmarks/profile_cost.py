"""Tree-chosen profiling against ``ncu --set full``: time and agreement of the bottleneck class (GPU).

    python benchmarks/profile_cost.py [--out benchmarks/results/profile_cost.json] [--repeat 1]

For each example kernel (``examples/*/original.cu`` with its ``spec.json``, through the
harness's launch mode) and each fixture program of ``tests/fixtures/ncu/programs`` (built
with ``nvcc -lineinfo``, profiled as the user's program) the profiler service runs:

* ``full``:  ``--set full`` (one ncu run);
* ``first``: the tree's choice for a first profile (no previous facts: one run);
* ``again``: the tree's choice on the next save (the first profile's facts steer the tree);
* ``floor``: one metric (``gpu__time_duration.sum``) and nothing else: the least any ncu
  collection of this kernel costs, so the table shows how far each tree profile is from it.

The time of a profile is the wall time of its ncu runs (``collection_wall_s``; the
compile is the same for all three and left out). Target: tree time <= 25 % of full's,
with the same bottleneck class (finer class, ``label``) for >= 90 % of kernels. Prints a
table and writes JSON with the machine, the date, the command and every raw sample.

``--cupti`` adds, for every kernel with a launch spec, the same tree profiles made in the
GPU worker through CUPTI (:mod:`kernel_lsp.services.gpu_worker`):

* ``cupti_cold``: a first profile by a worker started for it (its start-up, spawn to ready,
  added to the collection's wall time);
* ``cupti_first`` / ``cupti_again``: a first profile and the next save's, by a warm worker
  (started before, as the server's is once it knows the machine);
* ``cupti_prepared``: a first profile by another warm worker that made the spec's inputs before
  (``Profiler.prepare_inputs``, as the server asks when the file is opened): the first save's profile
  in the editor. Its ``prepare_s`` is the preparation's own time (not in the profile's).

Each row then carries ``cupti_ratio`` (``cupti_again`` ÷ ``full``, collection wall seconds),
``cupti_prepared_ratio`` (``cupti_prepared`` ÷ ``full``: target <= 10 %),
``cupti_agrees`` (its class equals full's), the cold and first ratios, ``cupti_save_s``
(the whole ``profile()`` call of ``cupti_again``: compile plus collection, what a save
waits for before the hover has its result, without the debounce) and the reason whenever
a profile fell back to ncu. Targets: ``cupti_ratio`` <= 10 % on the median kernel
(25 % required), agreement >= 90 %, ``cupti_save_s`` <= 1.5 s for kernels of <= 10 ms.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from kernel_lsp.config import Settings  # noqa: E402
from kernel_lsp.core.profiling_tree import parse_tree  # noqa: E402
from kernel_lsp.services import gpu_worker  # noqa: E402
from kernel_lsp.services import profiler as prof  # noqa: E402
from kernel_lsp.services.proc import run  # noqa: E402

TARGET_RATIO = 0.25
TARGET_AGREEMENT = 0.90
TARGET_CUPTI_RATIO = 0.10
TARGET_SAVE_S = 1.5
#: Kernels up to this duration count for the save-to-hover target, µs.
SAVE_TARGET_MAX_US = 10_000.0

#: A tree that collects nothing beyond the duration every run carries (the ``floor`` mode).
FLOOR_TREE = {"format": "kernel-lsp-profiling-tree", "version": 2, "name": "floor", "first_pass": [],
              "root": "nothing", "nodes": {"nothing": {"collect": []}}}


def corpus(names: str) -> list[tuple[str, str, str]]:
    """(name, kernel.cu, spec.json) of the corpus kernels named (comma-separated), or of all with ``all``."""
    folder = os.path.join(ROOT, "benchmarks", "corpus")
    wanted = None if names == "all" else {n.strip() for n in names.split(",") if n.strip()}
    out = []
    for spec in sorted(glob.glob(os.path.join(folder, "*", "spec.json"))):
        name = os.path.basename(os.path.dirname(spec))
        source = os.path.join(os.path.dirname(spec), "kernel.cu")
        if (wanted is None or name in wanted) and os.path.isfile(source):
            out.append((name, source, spec))
    missing = sorted((wanted or set()) - {n for n, _, _ in out})
    if missing:
        raise SystemExit(f"no corpus kernel named {', '.join(missing)}")
    return out


def examples() -> list[tuple[str, str, str]]:
    """(name, original.cu, spec.json) of every example with both files."""
    out = []
    for spec in sorted(glob.glob(os.path.join(ROOT, "examples", "*", "spec.json"))):
        folder = os.path.dirname(spec)
        original = os.path.join(folder, "original.cu")
        if os.path.isfile(original):
            out.append((os.path.basename(folder), original, spec))
    return out


#: Fixture programs profiled in program mode (``profileProgram``), program -> kernel.
PROGRAMS = {"stream": "stream_triad", "strided": "strided_gather", "bank_conflict": "transpose_smem_conflict",
            "fma": "fma_chains", "regs": "register_heavy", "tiny": "tiny_chase"}


def programs(build_dir: str, arch: str) -> list[tuple[str, str, str, str]]:
    """(name, source, kernel, binary) of every fixture program that builds."""
    out = []
    folder = os.path.join(ROOT, "tests", "fixtures", "ncu", "programs")
    for name, kernel in PROGRAMS.items():
        source = os.path.join(folder, f"{name}.cu")
        exe = os.path.join(build_dir, name)
        built = run(["nvcc", f"-arch={arch}", "-lineinfo", "-O3", "-o", exe, source], timeout_s=300)
        if built.ok:
            out.append((f"prog:{name}", source, kernel, exe))
        else:
            print(f"skipping {name}: nvcc failed: {built.stderr.strip()[:200]}")
    return out


#: Metrics whose values decide the bottleneck class (classify.py's first tests), kept per sample.
KEY_METRICS = ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
               "sm__throughput.avg.pct_of_peak_sustained_elapsed",
               "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", "launch__waves_per_multiprocessor",
               "sm__maximum_warps_per_active_cycle_pct", "gpu__time_duration.sum")


def sample(profiler: prof.Profiler, target: prof.Target, mode: str) -> dict:
    started = time.monotonic()
    result = profiler.profile(target, full=(mode == "full"), use_cache=False)
    total_s = time.monotonic() - started
    p = result.profile
    return {
        "mode": mode,
        "ok": result.ok,
        "message": result.message,
        "fallback": profiler.fallback_reason,
        "total_s": total_s,
        "wall_s": p.collection_wall_s if p else None,
        "passes": p.passes if p else None,
        "label": result.bottleneck.label if result.bottleneck else None,
        "primary": result.bottleneck.primary if result.bottleneck else None,
        "leaf": p.tree_leaf if p else None,
        "sections": list(p.sections) if p else [],
        "duration_us": p.duration_us if p else None,
        # The values the class is decided on, so that a disagreement with full can be read from the JSON.
        "key_metrics": {k: p.metrics[k] for k in KEY_METRICS if p and k in p.metrics},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(HERE, "results", "profile_cost.json"))
    parser.add_argument("--repeat", type=int, default=1, help="profiles of each kind per kernel")
    parser.add_argument("--ncu", default="ncu")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--no-programs", action="store_true", help="only the examples (no fixture programs)")
    parser.add_argument("--no-examples", action="store_true", help="leave out the examples (with --corpus: only those)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="start no new kernel after this many seconds; the kernels left are listed as skipped")
    parser.add_argument("--cupti", action="store_true", help="add the GPU worker's CUPTI profiles (kernels with a spec)")
    parser.add_argument("--no-floor", action="store_true", help="leave out the one-metric ncu run")
    parser.add_argument("--corpus", default=None, metavar="NAMES",
                        help="also the corpus kernels named (comma-separated, or 'all'), after the examples")
    parser.add_argument("--corpus-no-ncu-tree", action="store_true",
                        help="for corpus kernels, only full and the CUPTI profiles (no ncu tree profiles)")
    args = parser.parse_args()
    warm = gpu_worker.GpuWorker() if args.cupti else None
    prepared = gpu_worker.GpuWorker() if args.cupti else None
    for worker in (warm, prepared):
        if worker is None:
            continue
        try:
            info = worker.ensure()
            print(f"GPU worker: {info.device}, started in {info.startup_s:.2f} s; CUPTI "
                  f"{'usable on ' + str(info.chip) if info.cupti_ok else 'unusable: ' + str(info.cupti_error)}", flush=True)
        except gpu_worker.WorkerError as exc:
            print(f"GPU worker unusable: {exc}", flush=True)
    started = time.monotonic()
    samples: list[dict] = []
    rows = []
    targets: list[tuple[str, prof.Target]] = []
    # The small fixture programs first: under a --budget-s they give the most kernels per second.
    build_dir = tempfile.mkdtemp(prefix="profile-cost-")
    if not args.no_programs:
        for name, source, kernel, exe in programs(build_dir, args.arch):
            with open(source, encoding="utf-8") as f:
                targets.append((name, prof.Target(source, f.read(), kernel, program=exe)))
    for name, original, spec_path in [] if args.no_examples else examples():
        with open(spec_path, encoding="utf-8") as f:
            kernel = json.load(f)["kernel"]
        with open(original, encoding="utf-8") as f:
            targets.append((name, prof.Target(original, f.read(), kernel, spec_path=spec_path)))
    corpus_names = set()
    for name, source, spec_path in corpus(args.corpus) if args.corpus else []:
        with open(spec_path, encoding="utf-8") as f:
            kernel = json.load(f)["kernel"]
        with open(source, encoding="utf-8") as f:
            targets.append((name, prof.Target(source, f.read(), kernel, spec_path=spec_path)))
        corpus_names.add(name)
    for position, (name, target) in enumerate(targets):
        if args.budget_s is not None and time.monotonic() - started > args.budget_s:
            skipped = [n for n, _ in targets[position:]]
            print(f"budget of {args.budget_s:.0f} s spent: skipped {', '.join(skipped)}", flush=True)
            break
        kernel = target.kernel
        per_mode: dict[str, list[dict]] = {"full": [], "first": [], "again": [], "floor": [],
                                           "cupti_cold": [], "cupti_prepared": [], "cupti_first": [], "cupti_again": []}
        spec_mode = target.spec_path is not None
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory() as store:
                settings = Settings(ncu_path=args.ncu, arch=args.arch, profile_store=store, profile_timeout_s=300.0)
                profiler = prof.Profiler(settings, prof.ProfileStore(os.path.join(store, "tree")))
                full_profiler = prof.Profiler(settings, prof.ProfileStore(os.path.join(store, "full")))
                floor_profiler = prof.Profiler(settings, prof.ProfileStore(os.path.join(store, "floor")),
                                               tree=parse_tree(FLOOR_TREE))
                runs = [("full", full_profiler)]
                if not (args.corpus_no_ncu_tree and name in corpus_names):
                    runs += [("first", profiler), ("again", profiler)]
                if not args.no_floor:
                    runs.append(("floor", floor_profiler))
                cold_worker = None
                if warm is not None and spec_mode:
                    cold_worker = gpu_worker.GpuWorker()
                    cold = prof.Profiler(settings, prof.ProfileStore(os.path.join(store, "cold")), worker=cold_worker)
                    warm_profiler = prof.Profiler(settings, prof.ProfileStore(os.path.join(store, "warm")), worker=warm)
                    prepared_profiler = prof.Profiler(settings, prof.ProfileStore(os.path.join(store, "prepared")),
                                                      worker=prepared)
                    runs += [("cupti_cold", cold), ("cupti_prepared", prepared_profiler), ("cupti_first", warm_profiler),
                             ("cupti_again", warm_profiler)]
                for mode, who in runs:
                    preparation: dict = {}
                    if mode == "cupti_prepared":
                        begun = time.monotonic()
                        preparation = {"prepare_problem": who.prepare_inputs(target), "prepare_s": time.monotonic() - begun}
                    s = sample(who, target, mode)
                    s.update(preparation)
                    s["example"] = name
                    per_mode[mode].append(s)
                    samples.append(s)
                    if mode == "cupti_cold":
                        # The worker started before the collection's clock: its start-up is added here.
                        s["worker_start_s"] = cold_worker.start_wall_s
                        if s["wall_s"] is not None and cold_worker.start_wall_s is not None:
                            s["wall_s"] += cold_worker.start_wall_s
                        cold_worker.close()
        def med(mode: str) -> float | None:
            walls = [s["wall_s"] for s in per_mode[mode] if s["wall_s"] is not None and s["ok"]]
            return statistics.median(walls) if walls else None

        def last(mode: str, key: str):
            return per_mode[mode][-1][key] if per_mode[mode] else None

        full, first, again, floor = med("full"), med("first"), med("again"), med("floor")
        label_full = per_mode["full"][-1]["label"]
        cupti: dict = {}
        if per_mode["cupti_again"]:
            c_again, c_first, c_cold = med("cupti_again"), med("cupti_first"), med("cupti_cold")
            c_prepared = med("cupti_prepared")
            final = {mode: per_mode[mode][-1] for mode in ("cupti_cold", "cupti_prepared", "cupti_first", "cupti_again")}
            saves = [s["total_s"] for s in per_mode["cupti_again"] if s["ok"]]
            cupti = {
                "cupti_again_s": c_again, "cupti_first_s": c_first, "cupti_cold_s": c_cold,
                "cupti_ratio": c_again / full if c_again and full else None,
                "cupti_first_ratio": c_first / full if c_first and full else None,
                "cupti_cold_ratio": c_cold / full if c_cold and full else None,
                "cupti_prepared_s": c_prepared,
                "cupti_prepared_ratio": c_prepared / full if c_prepared and full else None,
                "label_cupti_prepared": final["cupti_prepared"]["label"],
                "cupti_agrees_prepared": final["cupti_prepared"]["label"] is not None
                and final["cupti_prepared"]["label"] == label_full,
                "prepare_s": final["cupti_prepared"].get("prepare_s"),
                "cupti_agrees": final["cupti_again"]["label"] is not None and final["cupti_again"]["label"] == label_full,
                "cupti_agrees_first": final["cupti_first"]["label"] is not None and final["cupti_first"]["label"] == label_full,
                "label_cupti_again": final["cupti_again"]["label"], "label_cupti_first": final["cupti_first"]["label"],
                "cupti_save_s": statistics.median(saves) if saves else None,
                "cupti_duration_us": final["cupti_again"]["duration_us"],
                "passes_cupti_again": final["cupti_again"]["passes"],
                "cupti_fallbacks": sorted({s["fallback"] for m in final for s in per_mode[m] if s["fallback"]}),
            }
        rows.append({
            "example": name, "kernel": kernel, "full_s": full, "first_s": first, "again_s": again,
            "floor_s": floor,
            "first_ratio": first / full if first and full else None, "again_ratio": again / full if again and full else None,
            "floor_ratio": floor / full if floor and full else None,
            "passes_full": last("full", "passes"), "passes_first": last("first", "passes"),
            "passes_again": last("again", "passes"),
            "label_full": label_full, "label_first": last("first", "label"), "label_again": last("again", "label"),
            "primary_full": last("full", "primary"), "primary_first": last("first", "primary"),
            "leaf_first": last("first", "leaf"), "leaf_again": last("again", "leaf"),
            "errors": [s["message"] for mode in per_mode.values() for s in mode if s["message"]],
            "corpus": name in corpus_names,
            **cupti,
        })
        # Written after every kernel so that a run stopped by a time limit still leaves its rows.
        write_report(args, rows, samples, skipped=[n for n, _ in targets[position + 1:]])
    shutil.rmtree(build_dir, ignore_errors=True)
    for worker in (warm, prepared):
        if worker is not None:
            worker.close()
    valid = write_report(args, rows, samples, skipped=[n for n, _ in targets[len(rows):]], final=True)
    return 0 if valid else 1


def write_report(args: argparse.Namespace, rows: list[dict], samples: list[dict], skipped: list[str], final: bool = False) -> list[dict]:
    """Print the table (a progress line until ``final``) and (re)write the JSON; returns the kernels that count."""
    if not final:
        r = rows[-1]
        print(f"{r['example']}: full {r['full_s']} s, first {r['first_s']} s, again {r['again_s']} s; "
              f"{r['label_full']} / {r['label_first']} / {r['label_again']}", flush=True)
        if "cupti_ratio" in r:
            print(f"    cupti: again {r['cupti_again_s']} s ({r['cupti_ratio']}), prepared first {r['cupti_prepared_s']} s "
                  f"({r['cupti_prepared_ratio']}), first {r['cupti_first_s']} s, cold "
                  f"{r['cupti_cold_s']} s, save {r['cupti_save_s']} s; {r['label_cupti_again']}; "
                  f"fallbacks {r['cupti_fallbacks']}", flush=True)
    else:
        print(f"{'example':19s} {'full s':>7s} {'first s':>8s} {'again s':>8s} {'floor s':>8s} {'first%':>7s} {'again%':>7s} "
              f"{'floor%':>7s}  full class / first / again")
        for r in rows:
            pct = lambda v: f"{100 * v:6.0f}%" if v is not None else "    n/a"  # noqa: E731
            num = lambda v: f"{v:7.2f}" if v is not None else "    n/a"  # noqa: E731
            print(f"{r['example']:19s} {num(r['full_s'])} {num(r['first_s']):>8s} {num(r['again_s']):>8s} "
                  f"{num(r.get('floor_s')):>8s} {pct(r['first_ratio'])} {pct(r['again_ratio'])} {pct(r.get('floor_ratio'))}  "
                  f"{r['label_full']} / {r['label_first']} / {r['label_again']}")
            if r.get("cupti_ratio") is not None:
                print(f"    cupti: again {r['cupti_again_s']:.3f} s ({r['cupti_ratio']:.1%} of full), first "
                      f"{r['cupti_first_s']:.3f} s, cold {r['cupti_cold_s'] or 0:.3f} s, save {r['cupti_save_s'] or 0:.3f} s, "
                      f"class {r['label_cupti_again']}{'' if r['cupti_agrees'] else ' (differs)'}")
            for fallback in r.get("cupti_fallbacks", [])[:2]:
                print(f"    ncu fallback: {fallback[:160]}")
            for error in r["errors"][:2]:
                print(f"    ! {error[:160]}")
    # A kernel counts only when all three profiles worked and the full profile named a class.
    valid = [r for r in rows if r["full_s"] and r["first_s"] and r["again_s"] and r["label_full"] not in (None, "unknown")]
    summary = {}
    with_cupti = [r for r in rows if r.get("cupti_ratio") is not None and r["label_full"] not in (None, "unknown")]
    if with_cupti:
        quick = [r["cupti_save_s"] for r in with_cupti
                 if r.get("cupti_save_s") is not None and (r.get("cupti_duration_us") or 0) <= SAVE_TARGET_MAX_US]
        summary_cupti = {
            "cupti_kernels": len(with_cupti),
            "median_cupti_ratio": statistics.median(r["cupti_ratio"] for r in with_cupti),
            "median_cupti_first_ratio": statistics.median(r["cupti_first_ratio"] for r in with_cupti if r["cupti_first_ratio"]),
            "median_cupti_cold_ratio": statistics.median([r["cupti_cold_ratio"] for r in with_cupti if r["cupti_cold_ratio"]] or [0]),
            "median_cupti_prepared_ratio": statistics.median(
                [r["cupti_prepared_ratio"] for r in with_cupti if r.get("cupti_prepared_ratio")] or [0]),
            "cupti_agreement_prepared": sum(bool(r.get("cupti_agrees_prepared")) for r in with_cupti) / len(with_cupti),
            "cupti_agreement": sum(bool(r["cupti_agrees"]) for r in with_cupti) / len(with_cupti),
            "cupti_agreement_first": sum(bool(r["cupti_agrees_first"]) for r in with_cupti) / len(with_cupti),
            "median_cupti_save_s": statistics.median(quick) if quick else None,
            "max_cupti_save_s": max(quick) if quick else None,
            "kernels_with_fallback": [r["example"] for r in with_cupti if r["cupti_fallbacks"]],
            "target_cupti_ratio": TARGET_CUPTI_RATIO, "required_cupti_ratio": TARGET_RATIO,
            "target_save_s": TARGET_SAVE_S,
        }
    else:
        summary_cupti = {}
    floors = [r["floor_ratio"] for r in valid if r.get("floor_ratio")]
    if valid:
        summary = {
            "kernels": len(valid),
            "kernels_left_out": [r["example"] for r in rows if r not in valid],
            "median_first_ratio": statistics.median(r["first_ratio"] for r in valid),
            "median_again_ratio": statistics.median(r["again_ratio"] for r in valid),
            "median_floor_ratio": statistics.median(floors) if floors else None,
            "agreement_first": sum(r["label_first"] == r["label_full"] for r in valid) / len(valid),
            "agreement_again": sum(r["label_again"] == r["label_full"] for r in valid) / len(valid),
            "agreement_primary_first": sum(r["primary_first"] == r["primary_full"] for r in valid) / len(valid),
            "target_ratio": TARGET_RATIO,
            "target_agreement": TARGET_AGREEMENT,
        }
        summary.update(summary_cupti)
        if final and summary_cupti:
            print(f"\nCUPTI (warm worker) vs full: median {summary_cupti['median_cupti_ratio']:.1%} (target <= "
                  f"{TARGET_CUPTI_RATIO:.0%}, required <= {TARGET_RATIO:.0%}); first with prepared inputs "
                  f"{summary_cupti['median_cupti_prepared_ratio']:.1%} (target <= {TARGET_CUPTI_RATIO:.0%}, class agreement "
                  f"{summary_cupti['cupti_agreement_prepared']:.0%}), first {summary_cupti['median_cupti_first_ratio']:.1%}, "
                  f"cold {summary_cupti['median_cupti_cold_ratio']:.1%}; class agreement {summary_cupti['cupti_agreement']:.0%}; "
                  f"save to result (<= 10 ms kernels) median {summary_cupti['median_cupti_save_s']} s, max "
                  f"{summary_cupti['max_cupti_save_s']} s")
        if final:
            print(f"\nmedian time vs full: first profile {summary['median_first_ratio']:.0%}, later saves "
                  f"{summary['median_again_ratio']:.0%} (target <= {TARGET_RATIO:.0%}; one metric alone: "
                  f"{summary['median_floor_ratio'] or 0:.0%}); class agreement: first "
                  f"{summary['agreement_first']:.0%}, again {summary['agreement_again']:.0%} (target >= {TARGET_AGREEMENT:.0%})")
    gpu = run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], timeout_s=30).stdout.strip() \
        if prof.proc.which("nvidia-smi") else None
    ncu_version = prof.ncu_reader.ncu_version(args.ncu)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({
            "benchmark": "profile_cost",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
            "machine": {"host": platform.node(), "python": platform.python_version(), "gpu": gpu, "ncu": ncu_version},
            "summary": summary,
            "skipped": skipped,
            "rows": rows,
            "samples": samples,
        }, f, indent=1)
    if final:
        print(f"wrote {args.out}")
    return valid


if __name__ == "__main__":
    sys.exit(main())
