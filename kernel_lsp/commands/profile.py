"""``kernel-lsp profile FILE.cu --spec SPEC.json [--json] [--full]``: profile one kernel with Nsight Compute.

The profiling tree picks what to collect (``--full``: ``ncu --set full``).
Without ``--spec``, the kernel's sidecar spec (``FILE.cu.<kernel>.spec.json``)
or in-source spec is used; ``--program`` profiles the user's own binary instead.
Exit status: 0 profiled, 1 profiling failed (message on stderr), 2 bad usage, 3 no GPU (nothing
measured), as ``verify`` and ``optimize``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import platformdirs

from kernel_lsp.cli import EXIT_NO_GPU, EXIT_OK, EXIT_REJECTED, EXIT_USAGE
from kernel_lsp.core.profiling_tree import TreeError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("profile", help="profile a kernel with Nsight Compute, guided by the profiling tree")
    parser.add_argument("file", help="the .cu file")
    parser.add_argument("--spec", help="launch spec v1 JSON (default: the sidecar or in-source spec)")
    parser.add_argument("--kernel", help="kernel name (default: the spec's)")
    parser.add_argument("--program", help="profile this binary (with --args) instead of launching from a spec")
    parser.add_argument("--args", nargs=argparse.REMAINDER, default=[], help="arguments for --program")
    parser.add_argument("--full", action="store_true", help="collect ncu --set full instead of the tree's choice")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--ncu", default="ncu", help="ncu executable (default: ncu on PATH)")
    parser.add_argument("--arch", default="sm_90", help="nvcc -arch (default sm_90)")
    parser.add_argument("--tree", help="profiling tree JSON (default: the shipped tree)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds one ncu run may take (default 300)")
    parser.add_argument("--cache-dir", help="profile store folder (default: the user cache dir)")
    parser.add_argument("--no-cache", action="store_true", help="profile again even when a cached profile matches")
    parser.set_defaults(func=run)


def _cache_dir(args: argparse.Namespace) -> str:
    if args.cache_dir:
        return args.cache_dir
    return os.path.join(platformdirs.user_cache_dir("kernel-lsp"), "profiles")


def gpu_missing() -> str | None:
    """Why this machine has no GPU to profile on (nvidia-smi's answer), or None when it has one.

    Asked after a profile failed: a failure on a machine without a GPU is "no GPU" (exit 3), whatever
    failed first (ncu missing, the launch refused)."""
    from kernel_lsp.services.machine import detect_machine

    machine = detect_machine()
    return None if machine.gpu is not None else machine.gpu_problem or "no GPU"


def run(args: argparse.Namespace) -> int:
    # Imported when the subcommand runs: cli.py imports every command module to build its parser.
    from kernel_lsp.services import profiler as prof

    try:
        with open(args.file, encoding="utf-8") as f:
            source = f.read()
    except OSError as exc:
        print(f"profile: cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    kernel = args.kernel
    spec_path, spec_data = args.spec, None
    if spec_path:
        try:
            with open(spec_path, encoding="utf-8") as f:
                kernel = kernel or json.load(f).get("kernel")
        except (OSError, json.JSONDecodeError, AttributeError) as exc:
            print(f"profile: cannot read spec {spec_path}: {exc}", file=sys.stderr)
            return EXIT_USAGE
    if not kernel:
        print("profile: name the kernel with --kernel (or give a spec that names it)", file=sys.stderr)
        return EXIT_USAGE
    # The user's nvcc, extraFlags and include paths (and the compile database) build the kernel, as in the editor.
    from kernel_lsp.services.session import cli_session

    overrides = {"ncuPath": args.ncu, "arch": args.arch, "profileTree": args.tree, "profileTimeoutS": args.timeout}
    session, problems = cli_session({k: v for k, v in overrides.items() if v is not None})
    for problem in problems:
        print(f"profile: {problem}", file=sys.stderr)
    if not args.program:
        # The session's look-up, as every command's: --spec, else the sidecar, else the in-source spec, each
        # refused when its file() inputs leave its folder or its parameters do not fit the kernel.
        found = session.resolve_spec(os.path.abspath(args.file), source, kernel, spec_path)
        if found.spec is None:
            print(f"profile: {found.problem or 'no launch spec for ' + kernel} (or profile a program: --program)",
                  file=sys.stderr)
            return EXIT_USAGE
        spec_path, spec_data = found.spec_path, found.data
    settings = session.settings
    try:
        profiler = prof.Profiler(settings, prof.ProfileStore(_cache_dir(args)), flags=session.build_flags)
    except (TreeError, OSError) as exc:
        print(f"profile: {exc}", file=sys.stderr)
        return EXIT_USAGE
    target = prof.Target(
        source_path=os.path.abspath(args.file), source_text=source, kernel=kernel, spec_path=spec_path,
        spec_data=spec_data, program=args.program, program_args=tuple(args.args),
    )
    result = profiler.profile(target, full=args.full, use_cache=not args.no_cache,
                              report=lambda message: print(f"... {message}", file=sys.stderr))
    if args.json:
        print(json.dumps(prof.as_json(result), indent=2))
    else:
        for line in prof.summary_lines(result):
            print(line)
    if result.message:
        if not args.json:
            print(f"profile: {result.message}", file=sys.stderr)
        missing = gpu_missing()
        if missing is not None:
            print(f"profile: nothing profiled, no GPU here ({missing})", file=sys.stderr)
            return EXIT_NO_GPU
        return EXIT_REJECTED
    return EXIT_OK
