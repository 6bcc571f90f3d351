"""``kernel-lsp traces export FILE.jsonl``: every optimization attempt as JSON lines."""

from __future__ import annotations

import argparse
import sqlite3
import sys

from kernel_lsp.services.traces import TraceStore, default_trace_path

EXIT_OK, EXIT_FAILED = 0, 1


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("traces", help="export traces of optimization attempts")
    actions = parser.add_subparsers(dest="traces_action", metavar="ACTION", required=True)
    export = actions.add_parser("export", help="write every attempt (prompt, tool calls, candidate, verdict) as JSON lines")
    export.add_argument("out", metavar="FILE.jsonl")
    export.add_argument("--db", help=f"trace database (default: {default_trace_path()})")
    export.set_defaults(func=_export)


def _export(args: argparse.Namespace) -> int:
    try:
        store = TraceStore(args.db)
        try:
            count = store.export_jsonl(args.out)
        finally:
            store.close()
    except (OSError, sqlite3.Error) as exc:
        print(f"kernel-lsp traces: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(f"{count} attempt(s) written to {args.out}")
    return EXIT_OK
