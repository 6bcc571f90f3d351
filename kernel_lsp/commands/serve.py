"""``kernel-lsp serve``: run the language server on stdio (default) or TCP."""

from __future__ import annotations

import argparse
import logging

from kernel_lsp.cli import EXIT_USAGE

log = logging.getLogger(__name__)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("serve", help="run the language server (stdio by default)")
    parser.add_argument("--stdio", action="store_true", help="talk LSP over stdin/stdout (the default)")
    parser.add_argument("--tcp", metavar="HOST:PORT", help="listen on a TCP address instead of stdio")
    parser.set_defaults(func=run)


def parse_address(text: str) -> tuple[str, int] | None:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host or "127.0.0.1", int(port)


def run(args: argparse.Namespace) -> int:
    # Imported here so that other subcommands do not pay for pygls.
    from kernel_lsp.server.server import create_server

    address = parse_address(args.tcp) if args.tcp else None
    if args.tcp and address is None:
        log.error("--tcp expects HOST:PORT (for example 127.0.0.1:2087), got %r", args.tcp)
        return EXIT_USAGE
    server = create_server()
    if address is not None:
        server.start_tcp(*address)
    else:
        server.start_io()
    return 0
