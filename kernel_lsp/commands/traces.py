"""``kernel-lsp traces export FILE.jsonl [--format jsonl|chat]``: optimization attempts as JSON lines."""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys

from kernel_lsp.services.trace_chat import trajectories
from kernel_lsp.services.traces import TraceStore, default_trace_path

EXIT_OK, EXIT_FAILED = 0, 1


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("traces", help="export traces of optimization attempts")
    actions = parser.add_subparsers(dest="traces_action", metavar="ACTION", required=True)
    export = actions.add_parser("export", help="write attempts (prompt, tool calls, candidate, verdict) as JSON lines")
    export.add_argument("out", metavar="FILE.jsonl")
    export.add_argument("--db", help=f"trace database (default: {default_trace_path()})")
    export.add_argument("--format", choices=("jsonl", "chat"), default="jsonl",
                        help="jsonl: every attempt as stored; chat: verified model trajectories as chat messages "
                             "with tool calls and results, for fine-tuning tools")
    export.add_argument("--all-verdicts", action="store_true",
                        help="with --format chat: also the trajectories the harness rejected (their verdict is in "
                             "metadata), e.g. for preference tuning")
    export.set_defaults(func=_export)


def _export(args: argparse.Namespace) -> int:
    try:
        store = TraceStore(args.db)
        try:
            if args.format == "chat":
                count = 0
                with open(args.out, "w", encoding="utf-8") as handle:
                    for example in trajectories(store.attempts(), accepted_only=not args.all_verdicts):
                        handle.write(json.dumps(example, ensure_ascii=False) + "\n")
                        count += 1
                what = "verified trajectory(ies)"
            else:
                count = store.export_jsonl(args.out)
                what = "attempt(s)"
        finally:
            store.close()
    except (OSError, sqlite3.Error) as exc:
        print(f"kernel-lsp traces: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(f"{count} {what} written to {args.out}")
    return EXIT_OK
