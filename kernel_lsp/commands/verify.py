"""``kernel-lsp verify ORIGINAL.cu CANDIDATE.cu --spec SPEC.json``: accept or reject a rewrite.

Exit status: 0 accepted, 1 rejected, 2 bad usage or spec, 3 no GPU (nothing was measured).
``--spec`` may be left out when the original carries an in-source spec
(``// kernel-lsp: spec {...}`` above the kernel) and ``--kernel`` names it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from kernel_lsp.cli import EXIT_NO_GPU, EXIT_OK, EXIT_REJECTED, EXIT_USAGE
from kernel_lsp.core.spec import SpecError, with_candidate_launch
from kernel_lsp.core.verdict import Verdict


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("verify", help="check that a rewrite is correct and faster than the original")
    parser.add_argument("original", help="the original .cu file")
    parser.add_argument("candidate", help="the rewritten .cu file")
    parser.add_argument("--spec", help="launch spec v1 JSON (default: the original's in-source spec)")
    parser.add_argument("--kernel", help="with an in-source spec: which kernel (default: the only one)")
    parser.add_argument("--candidate-launch", help='JSON object overriding the spec\'s "candidate" field, e.g. \'{"grid": ["n/256",1,1]}\'')
    parser.add_argument("--json", action="store_true", help="print the verdict as JSON")
    parser.add_argument("--seeds", type=int, default=3, help="random input seeds (default 3)")
    parser.add_argument("--sanitize", action="store_true", help="also run compute-sanitizer memcheck/racecheck/initcheck")
    parser.add_argument("--min-speedup", type=float, default=1.05, help="lower bound the speedup interval must reach (default 1.05)")
    parser.add_argument("--arch", help="sm_XX (default: detected with nvidia-smi)")
    parser.add_argument("--time-budget", type=float, default=2.0, help="seconds of timed trials (default 2)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds before the GPU child is killed (default 120)")
    parser.set_defaults(func=run)


def _load_spec(args: argparse.Namespace, original_source: str, session):
    """The spec as the session resolves it for the original (``--spec``, sidecar, in-source comment)."""
    found = session.resolve_spec(os.path.abspath(args.original), original_source, args.kernel, args.spec)
    if found.spec is None:
        raise SpecError([found.problem or "no launch spec"])
    spec = found.spec
    if args.candidate_launch:
        try:
            override = json.loads(args.candidate_launch)
        except RecursionError:
            raise SpecError(["--candidate-launch: nested too deeply"]) from None
        except ValueError as exc:
            raise SpecError([f"--candidate-launch: not valid JSON: {exc}"]) from None
        if not isinstance(override, dict):
            raise SpecError(["--candidate-launch: expected a JSON object such as '{\"grid\": [\"n/256\",1,1]}'"])
        spec = with_candidate_launch(spec, override)
    return spec


def _print(verdict: Verdict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(verdict.to_json(), indent=2))
        return
    print(verdict.summary())
    for error in verdict.errors[1:]:
        print(f"  error: {error}")
    if verdict.max_abs_error is not None:
        print(f"  max abs error {verdict.max_abs_error:.3g}, max rel error {verdict.max_rel_error:.3g}")
    for which, t in verdict.timings.items():
        print(f"  {which:9s} median {t.median_ms:.4f} ms  p10 {t.p10_ms:.4f}  p90 {t.p90_ms:.4f}  ({t.trials} trials)")
    if verdict.gpu:
        g = verdict.gpu
        print(f"  gpu {g.name}, driver {g.driver}, sm clock {g.sm_clock_mhz} MHz (max {g.max_sm_clock_mhz}), mem clock {g.mem_clock_mhz} MHz")
    print(f"  seeds {list(verdict.seeds)}, wall {verdict.wall_s:.1f} s")
    for warning in verdict.warnings:
        print(f"  warning: {warning}")
    if verdict.sanitizer:
        print(verdict.sanitizer)


def run(args: argparse.Namespace) -> int:
    # Imported when the subcommand runs: cli.py imports every command module to build its parser.
    from kernel_lsp.services.harness import GpuUnavailable, verify
    from kernel_lsp.services.session import cli_session
    from kernel_lsp.services.harness.protocol import TimingOptions

    try:
        with open(args.original, encoding="utf-8") as f:
            original = f.read()
        with open(args.candidate, encoding="utf-8") as f:
            candidate = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        print(f"kernel-lsp verify: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.seeds < 1:
        print("kernel-lsp verify: --seeds must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    session, problems = cli_session({"verifySeeds": args.seeds, "minSpeedup": args.min_speedup, "verifyTimeoutS": args.timeout})
    for problem in problems:
        print(f"kernel-lsp verify: {problem}", file=sys.stderr)
    try:
        spec = _load_spec(args, original, session)
    except SpecError as exc:
        print(f"kernel-lsp verify: {exc}", file=sys.stderr)
        return EXIT_USAGE
    options = session.verify_options(os.path.abspath(args.original), sanitize=args.sanitize, arch=args.arch,
                                     timing=dataclasses.replace(TimingOptions(), budget_s=args.time_budget))
    candidate_folder = os.path.dirname(os.path.abspath(args.candidate))
    if candidate_folder != os.path.dirname(os.path.abspath(args.original)):
        # The candidate's own local headers resolve too (its folder after the original's).
        build = options.build
        options = dataclasses.replace(options, build=dataclasses.replace(build, flags=build.flags + ("-I", candidate_folder)))
    try:
        verdict = verify(original, candidate, spec, options)
    except SpecError as exc:
        print(f"kernel-lsp verify: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except GpuUnavailable as exc:
        print(f"kernel-lsp verify: nothing verified, no GPU here: {exc}", file=sys.stderr)
        return EXIT_NO_GPU
    _print(verdict, args.json)
    return EXIT_OK if verdict.accepted else EXIT_REJECTED
