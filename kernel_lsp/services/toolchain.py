"""nvcc on the buffer's current text: compiler messages and per-kernel resource usage.

The text (saved or not) is written to a fresh temporary folder under the
document's own file name, and compiled there with the document's folder on the
include path, so ``#include "local.cuh"`` resolves as it does for the user's
build, and the user's file is never touched. Flags come from the workspace's
``compile_commands.json`` when it lists the file, else from settings:

    nvcc -arch=<arch> -cubin -Xptxas -v -lineinfo [flags] -I <folder> [-I include_paths] -o <name>.cubin <name>

Messages that name the temporary file are mapped back to the document's path.
Every failure is a value in :class:`CompileResult` (missing nvcc, timeout,
cancel), never an exception.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import MappingProxyType

from kernel_lsp.config import Settings
from kernel_lsp.core.launch_dims import defines_from_flags
from kernel_lsp.core.nvcc_output import CompilerMessage, ResourceUsage, parse_diagnostics, parse_resource_usage
from kernel_lsp.services import proc
from kernel_lsp.services.compile_db import CompileDb, DbFlags

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CompileResult:
    messages: tuple[CompilerMessage, ...]
    """Errors, warnings and notes; ``path`` is the document's path for messages about it."""
    resources: Mapping[str, ResourceUsage] = field(default_factory=lambda: MappingProxyType({}))
    """ptxas resource usage by demangled qualified kernel name (``ns::kern<float>``; ``extern "C"`` names as is),
    for the target architecture (the first one ptxas reported when the flags name several)."""
    by_base_name: Mapping[str, ResourceUsage] = field(default_factory=lambda: MappingProxyType({}))
    """The same records by base name (``kern``), first instance wins; what the kernel index matches on."""
    wall_s: float = 0.0
    """Wall time of the nvcc run, in seconds."""
    tool_missing: str | None = None
    """Why nvcc could not be started (not found), for the user; None when it ran."""
    timed_out: bool = False
    cancelled: bool = False
    returncode: int | None = None
    argv: tuple[str, ...] = ()
    flags_source: str = "settings"
    """``compile_commands.json`` or ``settings``: where the flags came from."""
    problems: tuple[str, ...] = ()
    """Other things the user should know (a malformed compile_commands.json, …)."""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.cancelled and self.tool_missing is None

    @cached_property
    def defines(self) -> dict[str, str]:
        """The ``-D`` macros of the compile's command line (launch sizes such as ``<<<g, BLOCK>>>`` use them)."""
        return defines_from_flags(self.argv)

    @property
    def errors(self) -> tuple[CompilerMessage, ...]:
        return tuple(m for m in self.messages if m.severity == "error")

    def resources_for(self, name: str) -> ResourceUsage | None:
        """Resource usage of the kernel called ``name`` in the source (``saxpy``, ``ns::saxpy`` or ``scale<4>``).

        Matches the qualified demangled name first, then the base name; with
        several template instances of one kernel the first one ptxas reported wins.
        """
        if name in self.resources:
            return self.resources[name]
        return self.by_base_name.get(name.rsplit("::", 1)[-1].split("<", 1)[0].strip())


def build_argv(settings: Settings, file_name: str, folder: str, db_flags: tuple[str, ...] | None) -> list[str]:
    argv = [settings.nvcc_path]
    if not db_flags or not any(f.startswith(("-arch", "--gpu-architecture", "-gencode", "--generate-code")) for f in db_flags):
        argv.append(f"-arch={settings.arch}")
    argv += ["-cubin", "-Xptxas", "-v", "-lineinfo"]
    if not file_name.endswith(".cu"):
        # nvcc picks the language from the suffix and rejects .cuh; headers and scratch buffers are CUDA.
        argv += ["-x", "cu"]
    if db_flags:
        argv += db_flags
    argv += ["-I", folder]
    for path in settings.include_paths:
        argv += ["-I", path]
    argv += settings.extra_flags
    stem = Path(file_name).stem or "buffer"
    argv += ["-o", f"{stem}.cubin", file_name]
    return argv


def dropped_flags_message(db: DbFlags) -> CompilerMessage:
    """One warning naming every flag of the compile database that the flag policy refused, and why."""
    items = "; ".join(f"'{d.flag}' ({d.reason})" for d in db.dropped)
    return CompilerMessage(None, None, None, "warning", "flags-dropped",
                           f"{db.db_path}: flags not passed to nvcc: {items}", tool="kernel-lsp")


def _map_file(message: CompilerMessage, temp_names: set[str], document_path: str) -> CompilerMessage:
    if message.path is not None and message.path in temp_names:
        return dataclasses.replace(message, path=document_path)
    return message


def compile_source(
    source: str | bytes,
    document_path: str,
    settings: Settings,
    *,
    workspace_root: str | None = None,
    compile_db: CompileDb | None = None,
    cancel: threading.Event | None = None,
) -> CompileResult:
    """Compile ``source`` as if it were the file at ``document_path``."""
    folder = os.path.dirname(os.path.abspath(document_path)) or os.getcwd()
    file_name = os.path.basename(document_path) or "buffer.cu"
    db = (compile_db or CompileDb()).flags_for(document_path, workspace_root, settings.allowed_compilers)
    problems = (db.problem,) if db.problem else ()
    policy_messages = (dropped_flags_message(db),) if db.dropped else ()
    argv = build_argv(settings, file_name, folder, db.flags)
    data = source.encode("utf-8", errors="replace") if isinstance(source, str) else source
    flags_source = "compile_commands.json" if db.flags is not None else "settings"
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kernel-lsp-") as tmp:
        temp_path = os.path.join(tmp, file_name)
        with open(temp_path, "wb") as handle:
            handle.write(data)
        try:
            result = proc.run(argv, timeout_s=settings.compile_timeout_s, cwd=tmp, cancel=cancel)
        except proc.ToolMissing:
            return CompileResult(
                messages=policy_messages,
                wall_s=time.monotonic() - start,
                tool_missing=(
                    f"nvcc was not found ('{settings.nvcc_path}'): compiler diagnostics and register counts are off. "
                    "Install the CUDA toolkit or set kernelLsp.nvccPath."
                ),
                argv=tuple(argv),
                flags_source=flags_source,
                problems=problems,
            )
    if result.timed_out:
        problems += (
            f"nvcc did not finish within {settings.compile_timeout_s:g} s and was stopped "
            "(setting compileTimeoutS); diagnostics were not updated.",
        )
    text = result.stderr + "\n" + result.stdout
    temp_names = {file_name, temp_path, os.path.realpath(temp_path), "./" + file_name}
    messages = policy_messages + tuple(_map_file(m, temp_names, document_path) for m in parse_diagnostics(text))
    resources: dict[str, ResourceUsage] = {}
    usages = parse_resource_usage(text)
    by_base: dict[str, ResourceUsage] = {}
    for usage in sorted(usages, key=lambda u: u.arch != settings.arch):  # the target arch first, order kept
        resources.setdefault(usage.qualified_name, usage)
        by_base.setdefault(usage.base_name, usage)
    return CompileResult(
        messages=messages,
        resources=MappingProxyType(resources),
        by_base_name=MappingProxyType(by_base),
        wall_s=result.wall_s,
        timed_out=result.timed_out,
        cancelled=result.cancelled,
        returncode=result.returncode,
        argv=result.argv,
        flags_source=flags_source,
        problems=problems,
    )
