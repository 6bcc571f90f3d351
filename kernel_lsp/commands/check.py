"""``kernel-lsp check FILE.cu [--json]``: the server's analysis on the command line.

Prints the kernels found, nvcc's errors and warnings (``file:line:col: severity:
message``), each kernel's ptxas resource usage and the theoretical occupancy of
each launch whose block size is known. Exit status 1 when nvcc reported an
error, 2 when the file cannot be read, 0 otherwise (also when nvcc is missing:
that is said on stderr, and the static analysis is still printed).

A ``compile_commands.json`` in the file's folder (or up to the current folder)
is used through the same flag policy as in the editor: flags that would choose
or wrap a program, or read a file outside the database's own project folder
(the current folder is no trust boundary: it may be the home folder), are
dropped and named.
The editor's work budgets apply (:mod:`kernel_lsp.core.budgets`): a file over 5 MB
or 20,000 top-level declarations is checked in reduced mode (nvcc only), one over
1 MB without the memory-access analysis, and one over 16 MB is refused (exit 2);
each is said on stderr. A NUL byte makes the file binary data to the index, which
is said too.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kernel_lsp.cli import EXIT_OK, EXIT_REJECTED, EXIT_USAGE
from kernel_lsp.config import resolve
from kernel_lsp.core.analysis import Binding, bind, describe, summary, thread_mapping
from kernel_lsp.core.budgets import REDUCED_BYTES, budget
from kernel_lsp.core.index import build_index
from kernel_lsp.core.parse import ParsedDocument, binary_reason
from kernel_lsp.core.spec import Spec, SpecError
from kernel_lsp.services.harness.specfile import load_spec_file
from kernel_lsp.services.compile_db import CompileDb
from kernel_lsp.services.kernel_report import KernelFacts, report
from kernel_lsp.services.session import Session, spec_problem
from kernel_lsp.services.source_view import FileAnalysis
from kernel_lsp.services.toolchain import CompileResult
from kernel_lsp.services.user_config import user_config_layer


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("check", help="analyse and compile a CUDA file, print diagnostics and resources")
    parser.add_argument("file", help="the .cu/.cuh file")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--arch", help="target architecture (default: settings, sm_90)")
    parser.add_argument("--nvcc", help="nvcc executable (default: settings, 'nvcc')")
    parser.add_argument("--no-compile", action="store_true", help="static analysis only, do not run nvcc")
    parser.add_argument("--spec", help="a launch spec: its sizes and block shape turn access patterns into numbers")
    parser.set_defaults(func=run)


def _binding(spec: Spec | None, kernel: str) -> Binding | None:
    if spec is None or spec.kernel != kernel:
        return None
    try:
        return Binding.from_spec(spec)
    except (SpecError, ValueError, ZeroDivisionError):
        return None


def _kernel_json(facts: KernelFacts, analysis: FileAnalysis | None, spec: Spec | None) -> dict[str, Any]:
    fn = facts.function
    found = analysis.kernels.get(fn.name) if analysis is not None else None
    return {
        "analysis": summary(found, _binding(spec, fn.name)) if found is not None else None,
        "name": fn.name,
        "signature": fn.signature,
        "line": fn.name_span.start.line + 1,
        "resources": asdict(facts.resources) if facts.resources is not None else None,
        "launches": [
            {
                "line": lf.launch.span.start.line + 1,
                "grid": lf.launch.grid,
                "block": lf.launch.block,
                "block_threads": lf.block_threads,
                "dynamic_shared_bytes": lf.dynamic_shared_bytes,
                "occupancy_pct": lf.occupancy.occupancy_pct if lf.occupancy else None,
                "limiter": lf.occupancy.limiter if lf.occupancy else None,
            }
            for lf in facts.launches
        ],
    }


def _message_line(m: Any) -> str:
    where = m.path or m.tool
    if m.line is not None:
        where += f":{m.line}"
        if m.column is not None:
            where += f":{m.column}"
    code = f" [{m.code}]" if m.code else ""
    return f"{where}: {m.severity}{code}: {m.message}"


def _print_analysis(analysis: FileAnalysis | None, name: str, spec: Spec | None) -> None:
    found = analysis.kernels.get(name) if analysis is not None else None
    if found is None:
        return
    binding = _binding(spec, name)
    print(f"  threads: {thread_mapping(found)}; writes {', '.join(found.written) or 'nothing'}"
          + (f"; reductions: {', '.join(f'{r.kind} {r.target}' for r in found.reductions)}" if found.reductions else ""))
    patterns = bind(found, binding) if binding is not None else ()
    for i, access in enumerate(found.accesses):
        where = f"line {access.user_line + 1}" if access.user_line is not None else "header"
        text = describe(patterns[i]) if patterns else f"{access.kind} {access.array}[{access.index}]"
        print(f"    {where}: {text}")
    for unknown in found.unknowns:
        print(f"    not modelled: {unknown}")


def _print_text(path: str, kernels: tuple[KernelFacts, ...], compile: CompileResult | None, functions: int,
                syntax_errors: int, analysis: FileAnalysis | None, spec: Spec | None) -> None:
    print(f"{path}: {functions} functions, {len(kernels)} kernels, {syntax_errors} syntax errors (tree-sitter)")
    if compile is not None:
        for m in compile.messages:
            print(_message_line(m))
    for facts in kernels:
        usage = facts.resources
        print(f"\n{facts.function.signature}  (line {facts.function.name_span.start.line + 1})")
        if usage is not None:
            print(f"  registers {usage.registers_per_thread}, spills {usage.spill_store_bytes} B stores / "
                  f"{usage.spill_load_bytes} B loads, shared {usage.shared_bytes_static} B, "
                  f"stack {usage.stack_frame_bytes} B")
        elif compile is not None and compile.errors:
            print("  resources unknown (the compile failed)")
        else:
            print("  resources unknown (not compiled)")
        for lf in facts.launches:
            head = f"  launch line {lf.launch.span.start.line + 1}: <<<{lf.launch.grid}, {lf.launch.block}>>>"
            if lf.occupancy is not None:
                print(f"{head} -> {lf.block_threads} threads, occupancy {lf.occupancy.occupancy_pct:.0f}% "
                      f"(limiter: {lf.occupancy.limiter})")
            elif lf.block_threads is not None:
                print(f"{head} -> {lf.block_threads} threads, occupancy unknown")
            else:
                print(f"{head} -> block size not a constant")
        _print_analysis(analysis, facts.function.name, spec)


def run(args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        data = path.read_bytes()
    except OSError as exc:
        print(f"kernel-lsp check: cannot read {path}: {exc.strerror}", file=sys.stderr)
        return EXIT_USAGE
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        print(f"kernel-lsp check: {path} is not valid UTF-8 (byte {exc.start}); bad bytes read as U+FFFD",
              file=sys.stderr)
    overrides = {k: v for k, v in (("arch", args.arch), ("nvccPath", args.nvcc)) if v}
    settings = resolve(user_config_layer(), ("command line", overrides))
    for problem in settings.problems:
        print(f"kernel-lsp check: {problem}", file=sys.stderr)
    spec = None
    if args.spec:
        try:
            spec = load_spec_file(args.spec)
        except (OSError, SpecError, ValueError) as exc:
            print(f"kernel-lsp check: --spec {args.spec}: {exc}", file=sys.stderr)
            return EXIT_USAGE
    parsed = ParsedDocument(data, max_parse_bytes=REDUCED_BYTES)
    limits = budget(len(data), None if parsed.unparsed else parsed.tree.root_node.child_count)
    if parsed.is_binary:
        print(f"kernel-lsp check: {path} {binary_reason(data)}", file=sys.stderr)
    for reason in dict.fromkeys(r for r in (limits.index, limits.analysis if limits.index is None else None,
                                            limits.compile) if r):
        print(f"kernel-lsp check: {path} {reason}", file=sys.stderr)
    if limits.compile is not None:
        return EXIT_USAGE
    # From any folder, a compile database beside the file is the file's project's: its forced
    # includes are trusted only inside that project (the current folder may be the home folder).
    session = Session(settings, workspace_root=str(Path.cwd()), compile_db=CompileDb(trust_workspace=False))
    if limits.reduced:
        index = build_index(b"")
    else:
        # Kernels that macros define or fill are read from their expansion, as the editor reads them.
        index = session.index(str(path.resolve()), data)
        for note in index.notes:
            print(f"kernel-lsp check: {path}:{note.span.start.line + 1}: {note.message}", file=sys.stderr)
    problem = spec_problem(spec, index, data.decode("utf-8", errors="replace")) if spec is not None else None
    if problem:
        print(f"kernel-lsp check: --spec {args.spec}: {problem}", file=sys.stderr)
        return EXIT_USAGE
    compile = None
    if not args.no_compile:
        compile = session.compile(data, str(path.resolve()))
        if compile.tool_missing:
            print(f"kernel-lsp check: {compile.tool_missing}", file=sys.stderr)
        for problem in compile.problems:
            print(f"kernel-lsp check: {problem}", file=sys.stderr)
    # The analysis and the launch sizes see the macros and headers the compile saw (the session's flags).
    analysis = (session.analysis(str(path.resolve()), data.decode("utf-8", errors="replace"))
                if limits.analysis is None else None)
    if analysis is not None and analysis.preprocessed.over_budget is not None:
        print(f"kernel-lsp check: {analysis.preprocessed.over_budget}", file=sys.stderr)
    kernels = report(index, data, compile, settings.arch, pre=analysis.preprocessed if analysis else None)
    if args.json:
        print(json.dumps({
            "file": str(path),
            "arch": settings.arch,
            "functions": [{"name": f.name, "qualifier": f.qualifier, "line": f.name_span.start.line + 1}
                          for f in index.functions],
            "syntax_errors": [{"line": e.span.start.line + 1, "message": e.message} for e in index.syntax_errors],
            "compile": None if compile is None else {
                "ran": compile.tool_missing is None,
                "tool_missing": compile.tool_missing,
                "timed_out": compile.timed_out,
                "wall_s": compile.wall_s,
                "flags_source": compile.flags_source,
                "messages": [asdict(m) for m in compile.messages],
            },
            "preprocessor": None if analysis is None else {
                "includes": list(analysis.preprocessed.includes),
                "not_expanded": list(analysis.preprocessed.passed_through),
                "messages": list(analysis.preprocessed.errors)},
            "left_out": {"index": limits.index, "analysis": limits.analysis},
            "kernels": [_kernel_json(k, analysis, spec) for k in kernels],
        }, indent=2))
    else:
        _print_text(str(path), kernels, compile, len(index.functions), len(index.syntax_errors), analysis, spec)
    failed = compile is not None and (bool(compile.errors) or compile.timed_out)
    return EXIT_REJECTED if failed else EXIT_OK
