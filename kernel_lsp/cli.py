"""Command-line entry point.

Every subcommand lives in its own module under ``kernel_lsp.commands``; a module
takes part by defining ``add_parser(subparsers)`` (which registers its parser and
sets ``func``) so that commands can be added without touching this file.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pkgutil
import sys

from kernel_lsp import __version__, commands

#: Exit codes shared by every subcommand.
EXIT_OK = 0
EXIT_REJECTED = 1
EXIT_USAGE = 2
#: Nothing could be measured: no GPU (or no pycuda) where a GPU is needed (verify, optimize).
EXIT_NO_GPU = 3


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kernel-lsp",
        description="A language server that makes CUDA kernels faster from inside the editor.",
    )
    parser.add_argument("--version", action="version", version=f"kernel-lsp {__version__}")
    parser.add_argument("--log-level", default="WARNING", help="Python logging level (default WARNING)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        module.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:
        # The reader went away (``kernel-lsp check f.cu | head``): stop quietly, and keep the interpreter's
        # final flush of stdout from raising again into a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_REJECTED
