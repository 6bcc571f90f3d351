"""Builds the kernel-lsp language server from its feature modules.

Each feature is one module under ``kernel_lsp.server`` with ``register(server)``;
:data:`FEATURES` lists them in registration order. Modules that other parts of
the project add later (``profiling``, ``code_actions``) are in the list already
and are skipped while they do not exist, so adding one needs no edit here.
"""

from __future__ import annotations

import importlib
import logging

from kernel_lsp.server.base import KernelLspServer

log = logging.getLogger(__name__)

#: Feature modules, in registration order (settings first: it handles initialize).
FEATURES: tuple[str, ...] = (
    "settings",
    "sync",
    "diagnostics",
    "hover",
    "symbols",
    "code_lens",
    "inlay_hints",
    "profiling",
    "code_actions",
)
#: Features the server works without (owned by other parts of the project, may be absent).
OPTIONAL_FEATURES = frozenset({"profiling", "code_actions"})


def create_server() -> KernelLspServer:
    server = KernelLspServer()
    for name in FEATURES:
        module_name = f"kernel_lsp.server.{name}"
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if name in OPTIONAL_FEATURES and exc.name == module_name:
                log.info("feature %s not installed", name)
                continue
            raise
        module.register(server)
    return server
