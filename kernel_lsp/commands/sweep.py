"""``kernel-lsp sweep PATH…``: optimize every kernel with a launch spec under the paths.

Each kernel goes through the same session as ``kernel-lsp optimize`` and the editor's "Optimize"
(:mod:`kernel_lsp.services.sweep`). ``--engine local`` runs them here, one after another;
``--engine ray`` submits one Ray task per kernel with one GPU each (``--address`` joins a running
cluster; without it Ray starts one on this machine with its GPUs). Progress goes to stderr.

Everything lands in ``--out`` (default ``kernel-lsp-sweep/`` in the current folder): ``sweep.json``,
``sweep.html``, a patch per accepted rewrite, drafted specs for kernels without one, and the kept
outcomes and verdicts that make a sweep started again resume where it stopped. ``--apply`` applies
the patches to the git working tree when it is clean.

Exit status: 0 a verified faster rewrite was found (with ``--dry-run``: candidates were listed),
1 none was (or ``--apply`` was refused), 2 bad usage or no kernel with a spec, 3 no GPU: nothing
could be verified.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING

from kernel_lsp.cli import EXIT_NO_GPU, EXIT_OK, EXIT_REJECTED, EXIT_USAGE

if TYPE_CHECKING:  # the sweep service (and Ray, lazily) is imported only when the command runs
    from kernel_lsp.services.sweep import DraftNote, SweepOptions

DEFAULT_OUT = "kernel-lsp-sweep"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("sweep", help="optimize every kernel with a launch spec under some paths (locally or on Ray)")
    parser.add_argument("paths", nargs="+", metavar="PATH", help="folders, .cu files or a compile_commands.json")
    parser.add_argument("--engine", choices=("local", "ray"), default="local",
                        help="local: this machine, one kernel at a time; ray: one Ray task per kernel with one GPU")
    parser.add_argument("--address", help="the Ray cluster to join (host:port or 'auto'; default: start one here)")
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"the sweep's folder (default ./{DEFAULT_OUT})")
    parser.add_argument("--apply", action="store_true", help="apply the accepted rewrites' patches to the clean git working tree")
    parser.add_argument("--dry-run", action="store_true", help="list candidates without verifying them (no GPU needed)")
    parser.add_argument("--budget", type=int, default=8, help="most candidates verified per kernel (default 8)")
    parser.add_argument("--seconds", type=float, default=600.0, help="wall-time budget per kernel (default 600)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the knowledge base's draw of techniques (default 0)")
    parser.add_argument("--kb", help="knowledge base: a file or a postgresql:// URL (default: kbUrl, else kbPath, else the per-user one)")
    parser.add_argument("--no-kb", action="store_true", help="neither consult nor update the knowledge base")
    parser.add_argument("--seeds", type=int, default=3, help="random input seeds per candidate (default 3)")
    parser.add_argument("--min-speedup", type=float, default=1.05, help="lower bound the speedup interval must reach (default 1.05)")
    parser.add_argument("--arch", help="sm_XX (default: detected on the machine that verifies)")
    parser.add_argument("--time-budget", type=float, default=2.0, help="seconds of timed trials per candidate (default 2)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds before a candidate's GPU run is killed (default 120)")
    parser.add_argument("--json", action="store_true", help="print the sweep report as JSON")
    parser.set_defaults(func=run)


def options_from(args: argparse.Namespace) -> SweepOptions:
    from kernel_lsp.services.sweep import SweepOptions, git_toplevel

    cwd = os.getcwd()
    return SweepOptions(
        out_dir=os.path.abspath(args.out), workspace_root=git_toplevel(cwd) or cwd,
        overrides=(("verifySeeds", args.seeds), ("minSpeedup", args.min_speedup), ("verifyTimeoutS", args.timeout)),
        kb_path=args.kb, use_kb=not args.no_kb, budget_candidates=args.budget, budget_s=args.seconds, seed=args.seed,
        verify=not args.dry_run, arch=args.arch, time_budget_s=args.time_budget)


def draft_line(draft: DraftNote) -> str:
    """One short line per drafted spec: the kernel, where its draft is and how many values it lacks (the list
    of what to fill in is in the draft's ``comment`` and on the sweep's page)."""
    if draft.draft_path is None:
        return f"no launch spec for {draft.path}:{draft.kernel}; {draft.todo[-1] if draft.todo else 'no draft'}"
    shown = os.path.relpath(draft.draft_path)
    shown = draft.draft_path if shown.startswith(".." + os.sep) else shown
    missing = f"{draft.placeholders} value{'s' if draft.placeholders != 1 else ''} to fill in" if draft.placeholders \
        else "complete"
    return f"no launch spec for {draft.path}:{draft.kernel}; draft {shown} ({missing})"


def run(args: argparse.Namespace) -> int:
    from kernel_lsp.services.sweep import SweepError, apply_patches, discover, outcome_rows, report_json, run_sweep

    if args.budget < 1 or args.seeds < 1:
        print("kernel-lsp sweep: --budget and --seeds must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    if args.address and args.engine != "ray":
        print("kernel-lsp sweep: --address needs --engine ray", file=sys.stderr)
        return EXIT_USAGE
    if args.apply and args.dry_run:
        print("kernel-lsp sweep: --apply needs verified rewrites; drop --dry-run", file=sys.stderr)
        return EXIT_USAGE
    options = options_from(args)
    found = discover(args.paths, options)
    for problem in found.problems:
        print(f"kernel-lsp sweep: {problem}", file=sys.stderr)
    for note in found.left_out:
        print(f"kernel-lsp sweep: {note}", file=sys.stderr)
    for draft in found.drafts:
        print(f"kernel-lsp sweep: {draft_line(draft)}", file=sys.stderr)
    if any(d.draft_path for d in found.drafts):
        print(f"kernel-lsp sweep: {len(found.drafts)} kernel{'s' if len(found.drafts) > 1 else ''} without a launch spec; "
              "each draft's \"comment\" says what to fill in; save it beside its file as FILE.cu.KERNEL.spec.json",
              file=sys.stderr)
    if not found.jobs:
        print("kernel-lsp sweep: no kernel with a launch spec under the given paths", file=sys.stderr)
        return EXIT_USAGE
    try:
        report = run_sweep(found, options, engine=args.engine, address=args.address)
    except SweepError as exc:
        print(f"kernel-lsp sweep: {exc}", file=sys.stderr)
        return EXIT_USAGE
    applied = apply_patches(report, options.out_dir, options.workspace_root) if args.apply else None
    if args.json:
        data = report_json(report)
        if applied is not None:
            data["apply"] = {"applied": list(applied.applied), "skipped": list(applied.skipped), "refused": applied.refused}
        print(json.dumps(data, indent=2))
    else:
        page = os.path.join(options.out_dir, "sweep.html")
        kept = len(report.outcomes) - report.ran
        if report.dry_run:
            for outcome in report.outcomes:
                print(f"{outcome.rel + ':' + outcome.kernel:50s} {outcome.candidates} candidates listed")
            print(f"dry run: {sum(o.candidates for o in report.outcomes)} candidates listed for {len(report.outcomes)} "
                  f"kernels, nothing verified; {report.ran} listed now, {kept} kept from before; report {page}")
        else:
            for kernel, status, technique, speed, tried in outcome_rows(report.outcomes):
                print(f"{kernel:50s} {status:12s} {technique:28s} {speed:22s} {tried} verified")
            print(f"{len(report.accepted)} of {len(report.outcomes)} kernels faster; {report.ran} optimized now, "
                  f"{kept} kept from before; report {page}")
        if applied is not None:
            for name in applied.applied:
                print(f"applied {name}")
            for why in applied.skipped:
                print(f"not applied: {why}")
            if applied.refused:
                print(f"kernel-lsp sweep: --apply refused: {applied.refused}", file=sys.stderr)
    if applied is not None and applied.refused:
        return EXIT_REJECTED
    if args.dry_run:
        return EXIT_OK if any(o.candidates for o in report.outcomes) else EXIT_REJECTED
    if report.accepted:
        return EXIT_OK
    if report.outcomes and all(o.status == "no-gpu" for o in report.outcomes):
        return EXIT_NO_GPU
    return EXIT_REJECTED
