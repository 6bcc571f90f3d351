"""``kernel-lsp optimize FILE.cu --spec SPEC.json``: search for a faster verified rewrite of a kernel.

Prints every candidate's verdict and writes the best verified one to
``FILE.optimized.cu`` (or ``--out``); the input changes only with ``--apply``.
When the best rewrite needs another launch (grid/block), that launch is printed
and written beside it as ``<out>.launch.json`` (the spec's ``candidate`` field).

``--dry-run`` (alias ``--no-verify``) lists the candidates without a GPU, clearly
marked unverified; nothing is written or applied then, except with
``--save-candidates DIR`` (one file per candidate plus ``candidates.json``).

The knowledge base draws the techniques to try with ``--seed`` (default 0): the
same knowledge base and seed give the same list. Without a profile of the kernel,
the state comes from the source's static features.

Exit status: 0 a verified faster rewrite was found (or, with --dry-run,
candidates were listed), 1 none was accepted (or, with --dry-run, none was
found), 2 bad usage or spec, 3 no GPU: nothing could be verified.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any

from kernel_lsp.cli import EXIT_NO_GPU, EXIT_OK, EXIT_REJECTED, EXIT_USAGE
from kernel_lsp.core.parse import newline_of
from kernel_lsp.core.transforms.launch_edit import applied_source


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("optimize", help="search for a faster, verified rewrite of a kernel")
    parser.add_argument("file", help="the .cu file")
    parser.add_argument("--spec", help="launch spec v1 JSON (default: <file>.<kernel>.spec.json or the in-source spec)")
    parser.add_argument("--kernel", help="the kernel (default: the spec's)")
    parser.add_argument("--model", help="a local model: manifest name or GGUF path, or with --endpoint the server's "
                                        "name for it (default: rules only)")
    parser.add_argument("--endpoint", metavar="URL", help="an OpenAI-compatible local server (http://127.0.0.1:8080/v1) "
                                                          "to ask instead of loading a GGUF")
    parser.add_argument("--model-mode", choices=("jobs", "agent"), help="planner, editor and repairer (jobs, the "
                                                                        "default) or the free tool-calling loop (agent)")
    parser.add_argument("--budget", type=int, default=8, help="most candidates verified (default 8)")
    parser.add_argument("--seconds", type=float, default=600.0, help="wall-time budget of the search (default 600)")
    parser.add_argument("--tokens", type=int, default=60_000, help="model token budget (default 60000)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--apply", action="store_true", help="write the best verified rewrite into FILE itself")
    parser.add_argument("--out", help="where the best rewrite goes (default FILE.optimized.cu)")
    parser.add_argument("--dry-run", "--no-verify", dest="dry_run", action="store_true",
                        help="list candidates without verifying them (no GPU needed; nothing is applied)")
    parser.add_argument("--save-candidates", metavar="DIR", help="write every candidate and candidates.json to DIR")
    parser.add_argument("--explain", action="store_true", help="also list each rule's precondition verdict")
    parser.add_argument("--kb", help="knowledge-base file (default: the per-user one)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the knowledge base's draw of techniques (default 0)")
    parser.add_argument("--no-kb", action="store_true", help="neither consult nor update the knowledge base")
    parser.add_argument("--traces", help="trace store file (default: the per-user one)")
    parser.add_argument("--seeds", type=int, default=3, help="random input seeds per candidate (default 3)")
    parser.add_argument("--min-speedup", type=float, default=1.05, help="lower bound the speedup interval must reach (default 1.05)")
    parser.add_argument("--arch", help="sm_XX (default: detected with nvidia-smi)")
    parser.add_argument("--time-budget", type=float, default=2.0, help="seconds of timed trials per candidate (default 2)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds before a candidate's GPU run is killed (default 120)")
    parser.set_defaults(func=run)


def _load_model(settings: Any, name: str | None, endpoint: str | None) -> Any:
    """The model the command line names, loaded with the user's model settings (threads, GPU layers, LoRA)."""
    from kernel_lsp.services.llm import model_from_settings

    return model_from_settings(dataclasses.replace(settings, model=name, model_endpoint=endpoint))


def _print(result: Any, explain: list[Any] | None, verified: bool) -> None:
    from kernel_lsp.services.optimizer import outcome_line

    print(f"kernel {result.kernel}: state {result.state or 'unknown'}; techniques {', '.join(result.techniques) or '(rule order)'}")
    for i, r in enumerate(result.results, 1):
        c = r.candidate
        v = r.verdict
        if v is None:
            line = f"UNVERIFIED: {r.note}"
        elif v.accepted:
            line = f"ACCEPTED {v.speedup:.2f}x [{v.speedup_ci_low:.2f}, {v.speedup_ci_high:.2f}], max rel err {v.max_rel_error or 0:.1e}"
        else:
            line = v.summary()
        launch = f" launch {json.dumps(dict(c.launch_override))}" if c.launch_override else ""
        print(f"{i:2d}. {c.technique} ({c.generator}): {c.description}{launch}\n    {line}")
    for outcome in explain or ():
        print(f"    rule {outcome.rule}: {'applies' if outcome.applicable else 'refused'}: {outcome.why}")
    if result.stopped:
        print(f"stopped: {result.stopped}")
    for message in result.messages:
        print(f"note: {message}")
    print(f"{len(result.results)} candidates, {result.wall_s:.1f} s, {result.tokens} model tokens")
    print(outcome_line(result, verified))


def _save_candidates(folder: str, result: Any) -> None:
    os.makedirs(folder, exist_ok=True)
    items = []
    for i, r in enumerate(result.results):
        name = f"{i:02d}_{r.candidate.technique}.cu"
        with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
            f.write(r.candidate.source)
        items.append({"file": name, **r.to_json()})
    with open(os.path.join(folder, "candidates.json"), "w", encoding="utf-8") as f:
        json.dump({"kernel": result.kernel, "path": result.path, "candidates": items}, f, indent=2)


def run(args: argparse.Namespace) -> int:

    from kernel_lsp.core.rules import evaluate
    from kernel_lsp.services.harness.protocol import TimingOptions
    from kernel_lsp.services.optimizer import Budget
    from kernel_lsp.services.session import cli_session

    try:
        with open(args.file, encoding="utf-8", newline="") as f:
            raw = f.read()
    except OSError as exc:
        print(f"kernel-lsp optimize: {exc}", file=sys.stderr)
        return EXIT_USAGE
    # The kernel model and the rules read one newline; the rewrite is written with the file's own.
    source, newline = raw.replace("\r\n", "\n"), newline_of(raw)
    if args.budget < 1 or args.seeds < 1:
        print("kernel-lsp optimize: --budget and --seeds must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    # The user's settings (nvcc, extraFlags, include paths) under the command line, as the editor uses them.
    overrides: dict[str, Any] = {"verifySeeds": args.seeds, "minSpeedup": args.min_speedup, "verifyTimeoutS": args.timeout}
    if args.model_mode:
        overrides["modelMode"] = args.model_mode
    session, problems = cli_session(overrides,
                                    kb_path=args.kb, use_kb=not args.no_kb, traces_path=args.traces,
                                    keep_traces=bool(args.traces))
    for problem in problems:
        print(f"kernel-lsp optimize: {problem}", file=sys.stderr)
    path = os.path.abspath(args.file)
    found = session.resolve_spec(path, source, args.kernel, args.spec)
    if found.spec is None:
        print(f"kernel-lsp optimize: {found.problem}", file=sys.stderr)
        return EXIT_USAGE
    spec = found.spec
    for warning in found.warnings:
        print(f"kernel-lsp optimize: warning: the launch spec {warning}", file=sys.stderr)
    kernel = args.kernel or spec.kernel
    if kernel != spec.kernel:
        print(f"kernel-lsp optimize: --kernel {kernel} but the spec describes {spec.kernel}", file=sys.stderr)
        return EXIT_USAGE
    try:
        model = _load_model(session.settings, args.model, args.endpoint) if args.model or args.endpoint else None
    except Exception as exc:  # a missing or broken model: say so, do not crash
        print(f"kernel-lsp optimize: cannot use model {args.endpoint or args.model}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    budget = Budget(max_candidates=args.budget, max_seconds=args.seconds, max_tokens=args.tokens)

    def progress(message: str, pct: int | None) -> None:
        if not args.json:
            print(f"... {message}", file=sys.stderr)

    result = session.optimize(source, path, kernel, spec, model=model, budget=budget, verify=not args.dry_run,
                              verify_overrides={"arch": args.arch,
                                                "timing": dataclasses.replace(TimingOptions(), budget_s=args.time_budget)},
                              profile=_last_profile(args.file, kernel), progress=progress, seed=args.seed)

    # The verdicts on the view the rules saw: the file's headers and flags expanded, as in the search.
    explain = evaluate(source, kernel, spec, preprocessed=session.preprocessed(path, source)) if args.explain else None
    if args.save_candidates:
        _save_candidates(args.save_candidates, result)
    written = None
    best = result.best
    if best is not None and not args.dry_run:
        written = args.file if args.apply else (args.out or _default_out(args.file))
        host = applied_source(best.candidate, source)
        with open(written, "w", encoding="utf-8", newline=newline) as f:
            f.write(host.source)
        if best.candidate.launch_override:
            with open(written + ".launch.json", "w", encoding="utf-8") as f:
                json.dump({"candidate": dict(best.candidate.launch_override)}, f, indent=2)
    if args.json:
        print(json.dumps({**result.to_json(), "written": written, "dry_run": args.dry_run,
                          "rules": [dataclasses.asdict(o) | {"rewrites": len(o.rewrites)} for o in explain or ()]}, indent=2))
    else:
        _print(result, explain, not args.dry_run)
        if args.dry_run:
            print("dry run: nothing was written or applied; drop --dry-run on a machine with a GPU to verify")
        elif result.gpu_error and best is None:
            print("nothing was written; --dry-run lists the candidates without a GPU")
        elif written:
            print(f"best: {best.candidate.technique} ({best.verdict.speedup:.2f}x) written to {written}")  # type: ignore[union-attr]
            if host.lines:
                print(f"      the launch{'es' if len(host.lines) > 1 else ''} at line {', '.join(map(str, host.lines))} edited to match")
            elif host.instruction:
                print(f"      {host.instruction}")
            if best.candidate.launch_override:
                print(f"      it needs the launch {json.dumps(dict(best.candidate.launch_override))} (also in {written}.launch.json)")
    if args.dry_run:
        return EXIT_OK if result.results else EXIT_REJECTED
    if result.gpu_error and not result.accepted:
        return EXIT_NO_GPU
    return EXIT_OK if best is not None else EXIT_REJECTED


def _last_profile(path: str, kernel: str) -> Any:
    """The kernel's last good profile from the profiler's default store (the server's too), or None."""
    try:
        import platformdirs

        from kernel_lsp.services.profiler import ProfileStore

        return ProfileStore(os.path.join(platformdirs.user_cache_dir("kernel-lsp"), "profiles")).last_good(path, kernel)
    except Exception:  # no profile: the knowledge base falls back to its default state
        return None


def _default_out(path: str) -> str:
    root, ext = os.path.splitext(path)
    return f"{root}.optimized{ext or '.cu'}"
