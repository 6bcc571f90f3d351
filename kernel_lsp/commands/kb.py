"""``kernel-lsp kb``: look at, share and reset the knowledge base (the per-user SQLite file or a team's PostgreSQL).

``kb show [--state S]``, ``kb stats``, ``kb export FILE.jsonl``, ``kb import FILE.jsonl``,
``kb reset [--yes]``, ``kb restore [--force]``; every one takes ``--db PATH`` or
``--db postgresql://…`` (else ``$KERNEL_LSP_KB``, else the user data directory); a
``--db`` file that does not exist is an error unless ``--create`` is given, and one
that is not a kernel-lsp knowledge base (another application's SQLite file) is
refused untouched. Export from
one and import into the other moves knowledge between the two backends.  Exit codes: 0 ok, 1 failed (an import
with any rejected line imports nothing and fails), 2 bad usage (including ``reset``
without ``--yes`` when there is no terminal to ask on).
"""

from __future__ import annotations

import argparse
import sys

from kernel_lsp.services.kb import KbError, KnowledgeBase, iter_entries_by_state

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", metavar="PATH", help="knowledge-base file or postgresql:// URL (default: $KERNEL_LSP_KB or the user data directory)")
    common.add_argument("--create", action="store_true",
                        help="with --db: make a new knowledge base when the file does not exist (else that is an error)")
    parser = subparsers.add_parser("kb", help="show, share or reset the optimization knowledge base")
    actions = parser.add_subparsers(dest="kb_action", metavar="ACTION")

    show = actions.add_parser("show", parents=[common], help="states and their technique entries")
    show.add_argument("--state", help="only this state, with its signature")
    show.set_defaults(func=_show)
    stats = actions.add_parser("stats", parents=[common], help="counts and per-technique results")
    stats.set_defaults(func=_stats)
    export = actions.add_parser("export", parents=[common], help="write derived states and attempts as JSON lines")
    export.add_argument("file", metavar="FILE.jsonl")
    export.set_defaults(func=_export)
    imp = actions.add_parser("import", parents=[common], help="merge an export (e.g. a team's shared knowledge)")
    imp.add_argument("file", metavar="FILE.jsonl")
    imp.set_defaults(func=_import)
    reset = actions.add_parser("reset", parents=[common], help="forget all attempts and derived states")
    reset.add_argument("--yes", action="store_true", help="do not ask")
    reset.set_defaults(func=_reset)
    restore = actions.add_parser("restore", parents=[common], help="bring back the rolling backup (<db>.backup)")
    restore.add_argument("--force", action="store_true", help="also when the database holds attempts of its own")
    restore.set_defaults(func=_restore)
    parser.set_defaults(func=lambda args: _usage(parser))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return EXIT_USAGE


def _open(args: argparse.Namespace) -> KnowledgeBase | None:
    try:
        # A --db that names no file is a mistyped path unless --create says to make one there.
        kb = KnowledgeBase.open(args.db, create=args.create or not args.db)
    except KbError as exc:
        print(f"kernel-lsp kb: {exc}", file=sys.stderr)
        return None
    for message in kb.messages:
        print(f"kernel-lsp kb: {message}", file=sys.stderr)
    return kb


def _show(args: argparse.Namespace) -> int:
    kb = _open(args)
    if kb is None:
        return EXIT_FAILED
    with kb:
        found = False
        for state, entries in iter_entries_by_state(kb):
            if args.state and state.name != args.state:
                continue
            found = True
            parent = f" (derived from {state.parent})" if state.parent else ""
            print(f"{state.name}{parent}: {state.description}")
            if args.state:
                for key, spec in sorted(state.signature.items()):
                    bound = {"min": ">=", "max": "<="}.get(spec.bound or "", "~")
                    print(f"    {key} {bound} {spec.value:g}  (weight {spec.weight:g}, scale {spec.scale_or_default(key):g})")
            for e in entries:
                print(f"  {e.technique:<30} predicted {e.predicted_speedup:5.2f}x  confidence {e.confidence:4.2f}"
                      f"  successes {e.successes}/{e.attempts}")
        if args.state and not found:
            print(f"kernel-lsp kb: no state named '{args.state}'", file=sys.stderr)
            return EXIT_USAGE
    return EXIT_OK


def _stats(args: argparse.Namespace) -> int:
    kb = _open(args)
    if kb is None:
        return EXIT_FAILED
    with kb:
        s = kb.stats()
    print(f"database        {s.path} (schema v{s.schema_version}, {s.size_bytes} bytes)")
    print(f"states          {s.states} ({s.derived_states} derived)")
    print(f"techniques      {s.techniques}")
    print(f"entries         {s.entries}")
    print(f"attempts        {s.attempts} ({s.accepted_attempts} accepted, {s.worked_examples} worked examples)")
    for t in s.by_technique:
        mean = f"{t.mean_speedup:.2f}x" if t.mean_speedup is not None else "n/a"
        print(f"  {t.technique:<30} {t.accepted}/{t.attempts} accepted, mean measured speedup {mean}")
    return EXIT_OK


def _export(args: argparse.Namespace) -> int:
    kb = _open(args)
    if kb is None:
        return EXIT_FAILED
    with kb:
        try:
            result = kb.export_jsonl(args.file)
        except OSError as exc:
            print(f"kernel-lsp kb: cannot write {args.file}: {exc}", file=sys.stderr)
            return EXIT_FAILED
    print(f"exported {result.attempts} attempts and {result.states} derived states to {result.path}")
    return EXIT_OK


def _import(args: argparse.Namespace) -> int:
    kb = _open(args)
    if kb is None:
        return EXIT_FAILED
    with kb:
        result = kb.import_jsonl(args.file)
    for problem in result.problems:
        print(f"kernel-lsp kb: {problem}", file=sys.stderr)
    if result.problems:
        return EXIT_FAILED
    print(f"imported {result.attempts_added} attempts ({result.attempts_duplicate} already known)"
          f" and {result.states_added} states")
    return EXIT_OK


def _restore(args: argparse.Namespace) -> int:
    kb = _open(args)
    if kb is None:
        return EXIT_FAILED
    with kb:
        try:
            restored = kb.restore_backup(force=args.force)
        except KbError as exc:
            print(f"kernel-lsp kb: {exc}", file=sys.stderr)
            return EXIT_FAILED
    print(f"restored {restored} attempts from {kb.backup_path}")
    return EXIT_OK


def _reset(args: argparse.Namespace) -> int:
    if not args.yes:
        if sys.stdin is None or not sys.stdin.isatty():
            print("kernel-lsp kb reset: refusing without --yes (no terminal to ask on)", file=sys.stderr)
            return EXIT_USAGE
        answer = input("Forget all recorded attempts and derived states? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("kept")
            return EXIT_OK
    kb = _open(args)
    if kb is None:
        return EXIT_FAILED
    with kb:
        kb.reset()
    print(f"knowledge base {kb.location} reset to the catalogue")
    return EXIT_OK
