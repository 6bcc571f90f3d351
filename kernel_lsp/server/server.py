"""Builds the kernel-lsp language server from its feature modules.

Each feature is one module under ``kernel_lsp.server`` with ``register(server)``;
:data:`FEATURES` lists them in registration order. Features extend each other
through the hook lists on the server state (hover sections, lens parts,
diagnostic sources, code-action providers), not by importing each other.
"""

from __future__ import annotations

import importlib

from kernel_lsp.server.base import KernelLspServer

#: Feature modules, in registration order (settings first: it handles initialize).
FEATURES: tuple[str, ...] = (
    "settings",
    "machine",
    "sync",
    "diagnostics",
    "macros",
    "hover",
    "definition",
    "signature_help",
    "symbols",
    "code_lens",
    "inlay_hints",
    "profiling",
    "access_hover",
    "optimize_actions",
    "code_actions",
)


def create_server() -> KernelLspServer:
    server = KernelLspServer()
    for name in FEATURES:
        importlib.import_module(f"kernel_lsp.server.{name}").register(server)
    return server
