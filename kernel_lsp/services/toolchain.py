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
from pathlib import Path
from types import MappingProxyType

from kernel_lsp.config import Settings
from kernel_lsp.core.nvcc_output import CompilerMessage, ResourceUsage, demangle, parse_messages, parse_resource_usage
from kernel_lsp.services import proc
from kernel_lsp.services.compile_db import CompileDb

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CompileResult:
    messages: tuple[CompilerMessage, ...]
    """Errors, warnings and notes; ``file`` is the document's path for messages about it."""
    resources: Mapping[str, ResourceUsage] = field(default_factory=lambda: MappingProxyType({}))
    """ptxas resource usage by demangled kernel name (``ns::kern(float*, int)``)."""
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

    @property
    def errors(self) -> tuple[CompilerMessage, ...]:
        return tuple(m for m in self.messages if m.severity in ("error", "fatal"))

    def resources_for(self, name: str) -> ResourceUsage | None:
        """Resource usage of the kernel called ``name`` as written in the source.

        Matches the demangled name exactly, then the unqualified name without
        parameters and template arguments (``ns::k<4>(float*)`` matches ``k``);
        with several instantiations the first one ptxas reported wins.
        """
        if name in self.resources:
            return self.resources[name]
        for full, usage in self.resources.items():
            if base_name(full) == name:
                return usage
        return None


def base_name(demangled: str) -> str:
    """``ns::kern<4>(float*, int)`` -> ``kern``; ``void scale<4>(float*)`` -> ``scale``."""
    depth = 0
    cut = len(demangled)
    for i, ch in enumerate(demangled):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = i
            break
    head = demangled[:cut]
    # Drop template arguments of the last component, then qualifiers.
    depth = 0
    out = []
    for ch in head:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    # A template instance carries its return type ("void scale<4>(float*)"): keep the last word.
    words = "".join(out).split()
    return words[-1].rsplit("::", 1)[-1] if words else ""


def build_argv(settings: Settings, file_name: str, folder: str, db_flags: tuple[str, ...] | None) -> list[str]:
    argv = [settings.nvcc_path]
    if not db_flags or not any(f.startswith(("-arch", "--gpu-architecture", "-gencode", "--generate-code")) for f in db_flags):
        argv.append(f"-arch={settings.arch}")
    argv += ["-cubin", "-Xptxas", "-v", "-lineinfo"]
    if db_flags:
        argv += db_flags
    argv += ["-I", folder]
    for path in settings.include_paths:
        argv += ["-I", path]
    argv += settings.extra_flags
    stem = Path(file_name).stem or "buffer"
    argv += ["-o", f"{stem}.cubin", file_name]
    return argv


def _map_file(message: CompilerMessage, temp_names: set[str], document_path: str) -> CompilerMessage:
    if message.file is not None and message.file in temp_names:
        return dataclasses.replace(message, file=document_path)
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
    if not file_name.endswith((".cu", ".cuh")):
        # nvcc decides the language from the suffix; a scratch buffer is CUDA.
        file_name += ".cu"
    db = (compile_db or CompileDb()).flags_for(document_path, workspace_root)
    problems = (db.problem,) if db.problem else ()
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
                messages=(),
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
    messages = tuple(_map_file(m, temp_names, document_path) for m in parse_messages(text))
    resources = {demangle(usage.mangled_name): usage for usage in parse_resource_usage(text)}
    return CompileResult(
        messages=messages,
        resources=MappingProxyType(resources),
        wall_s=result.wall_s,
        timed_out=result.timed_out,
        cancelled=result.cancelled,
        returncode=result.returncode,
        argv=result.argv,
        flags_source=flags_source,
        problems=problems,
    )
