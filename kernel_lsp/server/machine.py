"""What the machine can do, known up front: GPU, pycuda, ncu and nvcc detected once at start.

Detection runs off the event loop right after ``initialized`` (it asks
nvidia-smi). Until it answers ``state.machine`` is None and features offer
what they always did; once it is known, every open document already compiled
has its diagnostics published again and views are refreshed, so profiling hints vanish on a machine
without a GPU, and "Optimize" shows disabled with its reason. One message per
session names what is missing and how to get it.
"""

from __future__ import annotations

import asyncio
import logging

from lsprotocol import types

from kernel_lsp.server.base import KernelLspServer, ServerState
from kernel_lsp.services.machine import Machine, detect_machine

log = logging.getLogger(__name__)

#: ``once_key`` of the compiler's own "nvcc was not found" message (diagnostics.py): one mention per session.
NVCC_MISSING_KEY = "nvcc-missing"


def machine_message(state: ServerState, machine: Machine) -> str | None:
    lines = machine.missing()
    if machine.nvcc is None:
        if state.was_shown(NVCC_MISSING_KEY):
            lines = lines[1:]
        state.mark_shown(NVCC_MISSING_KEY)
    return "kernel-lsp: " + "; ".join(lines) + "." if lines else None


def known(state: ServerState, machine: Machine) -> None:
    """Adopt the detected machine (event loop): tell the user once, re-publish, refresh."""
    state.machine = machine
    message = machine_message(state, machine)
    if message is not None:
        state.show(message, types.MessageType.Warning, once_key="machine")
    for doc in state.documents.all():
        # Not before the first compile: that publication comes anyway, and clients (and tests)
        # take the first one for the compiler's answer.
        if doc.compile is not None:
            state.publish_diagnostics(doc)
    state.refresh_views()
    state.run_hooks(state.on_machine)


async def detect(state: ServerState) -> None:
    settings = state.settings
    machine = await asyncio.get_running_loop().run_in_executor(
        None, detect_machine, settings.nvcc_path, settings.ncu_path)
    known(state, machine)


def _on_initialized(state: ServerState) -> None:
    task = asyncio.ensure_future(detect(state))
    state.background_tasks.add(task)
    task.add_done_callback(state.background_tasks.discard)


def register(server: KernelLspServer) -> None:
    server.state.on_initialized.append(_on_initialized)
