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
from kernel_lsp.services import profiler as prof  # noqa: E402
from kernel_lsp.services.proc import run  # noqa: E402

TARGET_RATIO = 0.25
TARGET_AGREEMENT = 0.90

#: A tree that collects nothing beyond the duration every run carries (the ``floor`` mode).
FLOOR_TREE = {"format": "kernel-lsp-profiling-tree", "version": 2, "name": "floor", "first_pass": [],
              "root": "nothing", "nodes": {"nothing": {"collect": []}}}


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


def sample(profiler: prof.Profiler, target: prof.Target, mode: str) -> dict:
    result = profiler.profile(target, full=(mode == "full"), use_cache=False)
    p = result.profile
    return {
        "mode": mode,
        "ok": result.ok,
        "message": result.message,
        "wall_s": p.collection_wall_s if p else None,
        "passes": p.passes if p else None,
        "label": result.bottleneck.label if result.bottleneck else None,
        "primary": result.bottleneck.primary if result.bottleneck else None,
        "leaf": p.tree_leaf if p else None,
        "sections": list(p.sections) if p else [],
        "duration_us": p.duration_us if p else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(HERE, "results", "profile_cost.json"))
    parser.add_argument("--repeat", type=int, default=1, help="profiles of each kind per kernel")
    parser.add_argument("--ncu", default="ncu")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--no-programs", action="store_true", help="only the examples (no fixture programs)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="start no new kernel after this many seconds; the kernels left are listed as skipped")
    args = parser.parse_args()
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
    for name, original, spec_path in examples():
        with open(spec_path, encoding="utf-8") as f:
            kernel = json.load(f)["kernel"]
        with open(original, encoding="utf-8") as f:
            targets.append((name, prof.Target(original, f.read(), kernel, spec_path=spec_path)))
    for position, (name, target) in enumerate(targets):
        if args.budget_s is not None and time.monotonic() - started > args.budget_s:
            skipped = [n for n, _ in targets[position:]]
            print(f"budget of {args.budget_s:.0f} s spent: skipped {', '.join(skipped)}", flush=True)
            break
        kernel = target.kernel
        per_mode: dict[str, list[dict]] = {"full": [], "first": [], "again": [], "floor": []}
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory() as store:
                settings = Settings(ncu_path=args.ncu, arch=args.arch, profile_store=store, profile_timeout_s=300.0)
                profiler = prof.Profiler(settings, prof.ProfileStore(os.path.join(store, "tree")))
                full_profiler = prof.Profiler(settings, prof.ProfileStore(os.path.join(store, "full")))
                floor_profiler = prof.Profiler(settings, prof.ProfileStore(os.path.join(store, "floor")),
                                               tree=parse_tree(FLOOR_TREE))
                for mode, who in (("full", full_profiler), ("first", profiler), ("again", profiler), ("floor", floor_profiler)):
                    s = sample(who, target, mode)
                    s["example"] = name
                    per_mode[mode].append(s)
                    samples.append(s)
        def med(mode: str) -> float | None:
            walls = [s["wall_s"] for s in per_mode[mode] if s["wall_s"] is not None and s["ok"]]
            return statistics.median(walls) if walls else None

        full, first, again, floor = med("full"), med("first"), med("again"), med("floor")
        label_full = per_mode["full"][-1]["label"]
        rows.append({
            "example": name, "kernel": kernel, "full_s": full, "first_s": first, "again_s": again,
            "floor_s": floor,
            "first_ratio": first / full if first and full else None, "again_ratio": again / full if again and full else None,
            "floor_ratio": floor / full if floor and full else None,
            "passes_full": per_mode["full"][-1]["passes"], "passes_first": per_mode["first"][-1]["passes"],
            "passes_again": per_mode["again"][-1]["passes"],
            "label_full": label_full, "label_first": per_mode["first"][-1]["label"], "label_again": per_mode["again"][-1]["label"],
            "primary_full": per_mode["full"][-1]["primary"], "primary_first": per_mode["first"][-1]["primary"],
            "leaf_first": per_mode["first"][-1]["leaf"], "leaf_again": per_mode["again"][-1]["leaf"],
            "errors": [s["message"] for mode in per_mode.values() for s in mode if s["message"]],
        })
        # Written after every kernel so that a run stopped by a time limit still leaves its rows.
        write_report(args, rows, samples, skipped=[n for n, _ in targets[position + 1:]])
    shutil.rmtree(build_dir, ignore_errors=True)
    valid = write_report(args, rows, samples, skipped=[n for n, _ in targets[len(rows):]], final=True)
    return 0 if valid else 1


def write_report(args: argparse.Namespace, rows: list[dict], samples: list[dict], skipped: list[str], final: bool = False) -> list[dict]:
    """Print the table (a progress line until ``final``) and (re)write the JSON; returns the kernels that count."""
    if not final:
        r = rows[-1]
        print(f"{r['example']}: full {r['full_s']} s, first {r['first_s']} s, again {r['again_s']} s; "
              f"{r['label_full']} / {r['label_first']} / {r['label_again']}", flush=True)
    else:
        print(f"{'example':19s} {'full s':>7s} {'first s':>8s} {'again s':>8s} {'floor s':>8s} {'first%':>7s} {'again%':>7s} "
              f"{'floor%':>7s}  full class / first / again")
        for r in rows:
            pct = lambda v: f"{100 * v:6.0f}%" if v is not None else "    n/a"  # noqa: E731
            num = lambda v: f"{v:7.2f}" if v is not None else "    n/a"  # noqa: E731
            print(f"{r['example']:19s} {num(r['full_s'])} {num(r['first_s']):>8s} {num(r['again_s']):>8s} "
                  f"{num(r.get('floor_s')):>8s} {pct(r['first_ratio'])} {pct(r['again_ratio'])} {pct(r.get('floor_ratio'))}  "
                  f"{r['label_full']} / {r['label_first']} / {r['label_again']}")
            for error in r["errors"][:2]:
                print(f"    ! {error[:160]}")
    # A kernel counts only when all three profiles worked and the full profile named a class.
    valid = [r for r in rows if r["full_s"] and r["first_s"] and r["again_s"] and r["label_full"] not in (None, "unknown")]
    summary = {}
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
