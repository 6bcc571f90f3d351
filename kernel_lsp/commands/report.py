"""``kernel-lsp report FILE.cu [--spec SPEC.json] [--out DIR]``: an HTML profile report per kernel.

Each page shows the kernel on a roofline (FP32 against DRAM), its warp stall reasons as a bar
chart and its optimization history (every verified attempt in the knowledge base, with its
speedup). The profile is the one given (``--profile`` JSON from ``kernel-lsp profile --json``,
or ``--ncu-csv`` from ``ncu --csv --page raw``), else the profile store's last good one; with
``--spec`` and none stored, the kernel is profiled now (full set, needs a GPU and ncu).
Pages go to ``DIR`` (default ``FILE.cu.report/``), with an ``index.html``.

Exit status: 0 written, 2 bad usage (unreadable file, spec or profile), 3 no GPU: ``--spec`` asked for a
profile that could not be made here (the pages are written without it).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
from typing import Any

from kernel_lsp.cli import EXIT_NO_GPU, EXIT_OK, EXIT_USAGE


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("report", help="write an HTML profile report (roofline, stalls, history) per kernel")
    parser.add_argument("file", help="the .cu file")
    parser.add_argument("--spec", help="launch spec v1 JSON: report its kernel, profiling it now if nothing is stored")
    parser.add_argument("--kernel", action="append", help="report only this kernel (repeatable; default: every kernel)")
    parser.add_argument("--out", help="folder for the pages (default FILE.cu.report)")
    parser.add_argument("--profile", help="a profile JSON (kernel-lsp profile --json, or one profile object)")
    parser.add_argument("--ncu-csv", help="ncu --csv --page raw output (.csv or .csv.gz) with the kernels' metrics")
    parser.add_argument("--kb", help="knowledge-base file (default: the per-user one)")
    parser.add_argument("--no-kb", action="store_true", help="leave the optimization history out")
    parser.add_argument("--cache-dir", help="profile store folder (default: the user cache dir)")
    parser.add_argument("--ncu", default="ncu", help="ncu executable for --spec profiling (default: ncu on PATH)")
    parser.add_argument("--arch", default="sm_90", help="nvcc -arch for --spec profiling (default sm_90)")
    parser.set_defaults(func=run)


def _given_profiles(args: argparse.Namespace) -> dict[str, Any]:
    """Kernel name -> KernelProfile from --profile / --ncu-csv; raises ValueError or OSError."""
    from kernel_lsp.core.profile import profile_from_json
    from kernel_lsp.services.ncu_reader import parse_raw_csv, to_profiles

    found: dict[str, Any] = {}
    if args.ncu_csv:
        opener = gzip.open if args.ncu_csv.endswith(".gz") else open
        with opener(args.ncu_csv, "rt", encoding="utf-8") as f:
            for profile in to_profiles(parse_raw_csv(f.read())):
                found.setdefault(profile.kernel, profile)
    if args.profile:
        with open(args.profile, encoding="utf-8") as f:
            data = json.load(f)
        data = data.get("profile", data) if isinstance(data, dict) else data
        try:
            profile = profile_from_json(data)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{args.profile}: not a kernel-lsp profile ({exc})") from None
        found[profile.kernel] = profile
    return found


def _attempts(args: argparse.Namespace) -> list[Any]:
    if args.no_kb:
        return []
    from kernel_lsp.services.kb import KbError, KnowledgeBase

    try:
        kb = KnowledgeBase.open(args.kb)
    except KbError as exc:
        print(f"kernel-lsp report: knowledge base unavailable, no history: {exc}", file=sys.stderr)
        return []
    try:
        return kb.attempts()
    finally:
        kb.close()


def _profile_now(args: argparse.Namespace, source: str, kernel: str, store: Any) -> Any:
    """Profile ``kernel`` from ``--spec`` with the full set (the roofline needs it); None with the reason printed."""
    from kernel_lsp.config import Settings
    from kernel_lsp.services import profiler as prof

    settings = Settings(ncu_path=args.ncu, arch=args.arch)
    profiler = prof.Profiler(settings, store)
    target = prof.Target(source_path=os.path.abspath(args.file), source_text=source, kernel=kernel,
                         spec_path=args.spec, spec_data=None, program=None, program_args=())
    result = profiler.profile(target, full=True, report=lambda message: print(f"... {message}", file=sys.stderr))
    if result.message:
        print(f"kernel-lsp report: {kernel} not profiled: {result.message}", file=sys.stderr)
    return result.profile


def run(args: argparse.Namespace) -> int:
    import platformdirs

    from kernel_lsp.services.profiler import ProfileStore
    from kernel_lsp.services.report import intensity_text, write_reports

    try:
        with open(args.file, encoding="utf-8") as f:
            source = f.read()
    except OSError as exc:
        print(f"kernel-lsp report: {exc}", file=sys.stderr)
        return EXIT_USAGE
    kernels = args.kernel
    if not kernels:
        from kernel_lsp.services.session import Session

        # The kernels the editor and `check` list: those that macros define included.
        kernels = list(dict.fromkeys(f.name for f in Session().index(os.path.abspath(args.file), source).kernels))
    if args.spec:
        try:
            with open(args.spec, encoding="utf-8") as f:
                spec_kernel = json.load(f)["kernel"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"kernel-lsp report: cannot read the kernel of spec {args.spec}: {exc}", file=sys.stderr)
            return EXIT_USAGE
        kernels = [*(kernels or []), spec_kernel] if spec_kernel not in (kernels or []) else kernels
    try:
        profiles = _given_profiles(args)
    except (OSError, ValueError) as exc:
        print(f"kernel-lsp report: {exc}", file=sys.stderr)
        return EXIT_USAGE
    store = ProfileStore(args.cache_dir or os.path.join(platformdirs.user_cache_dir("kernel-lsp"), "profiles"))
    no_gpu = None
    if args.spec and spec_kernel not in profiles and store.last_good(os.path.abspath(args.file), spec_kernel) is None:
        profile = _profile_now(args, source, spec_kernel, store)
        if profile is not None:
            profiles[spec_kernel] = profile
        else:
            from kernel_lsp.commands.profile import gpu_missing

            no_gpu = gpu_missing()
    given = "--ncu-csv " + args.ncu_csv if args.ncu_csv else ("--profile " + args.profile if args.profile else "profiled now")
    result = write_reports(args.file, source, args.out, kernels=kernels, profiles=profiles, store=store,
                           attempts=_attempts(args), profile_source=given)
    for message in result.messages:
        print(f"kernel-lsp report: {message}", file=sys.stderr)
    for kernel, page in result.pages.items():
        roof = profiles.get(kernel)
        line = ""
        if roof is not None:
            from kernel_lsp.core.report_model import roofline

            point = roofline(roof.metrics)
            line = f"  ({intensity_text(point)})" if point is not None else "  (no roofline metrics)"
        print(f"{kernel}: {page}{line}")
    print(f"index: {result.index_path}")
    if no_gpu is not None:
        print(f"kernel-lsp report: {spec_kernel} not profiled, no GPU here ({no_gpu})", file=sys.stderr)
        return EXIT_NO_GPU
    return EXIT_OK
