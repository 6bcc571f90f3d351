"""nvcc: one set of build flags and one compile for every nvcc run kernel-lsp makes.

:class:`BuildFlags` is what every nvcc run of a file uses (diagnostics, the
verifier, the profiler's build, the model's compile tool), resolved once by
:func:`build_flags`: the workspace's ``compile_commands.json`` when it lists the
file, else the settings, then always the file's own folder and the settings'
include paths and ``extraFlags``:

    nvcc <arch flags> -cubin -Xptxas -v -lineinfo [flags] -I <folder> [-I include_paths] [extraFlags] -o <stem>.cubin <file>

:func:`compile_in` writes the text (saved or not) to a scratch folder under the
document's own file name and compiles it there, so ``#include "local.cuh"``
resolves as in the user's build and the user's file is never touched; messages
that name the scratch file are mapped back to the document's path. The one
:class:`CompileResult` carries the diagnostics, the ptxas resource usage and the
entry names (both read once from ptxas's verbose output), and the cubin. Every
failure is a value (missing nvcc, timeout, cancel), never an exception.
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

#: Flags that choose the target architecture; a value follows the bare forms.
_ARCH_WITH_VALUE = frozenset({"-arch", "--gpu-architecture", "-gencode", "--generate-code", "-code", "--gpu-code"})
_ARCH_PREFIXES = ("-arch=", "--gpu-architecture=", "-gencode=", "--generate-code=", "-code=", "--gpu-code=")


def split_arch_flags(flags: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(architecture flags, the rest), order kept: the verifier replaces the first with the GPU it runs on."""
    arch: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(flags):
        flag = flags[i]
        if flag in _ARCH_WITH_VALUE and i + 1 < len(flags):
            arch += flags[i : i + 2]
            i += 2
            continue
        (arch if flag.startswith(_ARCH_PREFIXES) else rest).append(flag)
        i += 1
    return tuple(arch), tuple(rest)


@dataclass(frozen=True)
class BuildFlags:
    """The nvcc command line of one file, less kernel-lsp's own output choices."""

    nvcc: str = "nvcc"
    arch_flags: tuple[str, ...] = ("-arch=sm_90",)
    """``-arch=sm_90`` from the settings, or the database's own ``-gencode``/``-arch`` flags."""
    flags: tuple[str, ...] = ()
    """Everything else, in order: the database's flags, ``-I <file's folder>``, ``-I`` include paths, ``extraFlags``."""
    timeout_s: float = 120.0
    """Longest one nvcc run may take before it is killed."""
    flags_source: str = "settings"
    """``compile_commands.json`` or ``settings``: where the flags came from."""
    problems: tuple[str, ...] = ()
    """What the user should know about the flags (a malformed compile_commands.json, …)."""
    notices: tuple[CompilerMessage, ...] = ()
    """Diagnostics about the flags themselves (compile-database flags the policy dropped), shown with
    every compile's messages."""

    def for_arch(self, arch: str) -> BuildFlags:
        """The same flags for one architecture (the verifier builds for the GPU it measures on)."""
        return dataclasses.replace(self, arch_flags=(f"-arch={arch}",))

    @property
    def target_arch(self) -> str | None:
        """``sm_90`` when the architecture flags name one ``sm_``/``compute_`` target first, else None."""
        for flag in self.arch_flags:
            for part in flag.replace("=", ",").split(","):
                if part.startswith(("sm_", "compute_")):
                    return "sm_" + part.split("_", 1)[1]
        return None

    @cached_property
    def defines(self) -> dict[str, str]:
        """The ``-D`` macros of the command line (launch sizes such as ``<<<g, BLOCK>>>`` use them)."""
        return defines_from_flags(self.flags)

    def argv(self, file_name: str) -> list[str]:
        """The nvcc command that compiles ``file_name`` (in the current folder) to ``<stem>.cubin``."""
        argv = [self.nvcc, *self.arch_flags, "-cubin", "-Xptxas", "-v", "-lineinfo"]
        if not file_name.endswith(".cu"):
            # nvcc picks the language from the suffix and rejects .cuh; headers and scratch buffers are CUDA.
            argv += ["-x", "cu"]
        argv += self.flags
        stem = Path(file_name).stem or "buffer"
        return argv + ["-o", f"{stem}.cubin", file_name]


def build_flags(
    settings: Settings, document_path: str, *, workspace_root: str | None = None, compile_db: CompileDb | None = None,
) -> BuildFlags:
    """The flags of every nvcc run for ``document_path`` (see the module docstring)."""
    folder = os.path.dirname(os.path.abspath(document_path)) or os.getcwd()
    db = (compile_db or CompileDb()).flags_for(document_path, workspace_root, settings.allowed_compilers)
    db_arch, db_rest = split_arch_flags(db.flags or ())
    flags = [*db_rest, "-I", folder]
    for path in settings.include_paths:
        flags += ["-I", path]
    extra_arch, extra_rest = split_arch_flags(settings.extra_flags)
    flags += extra_rest
    return BuildFlags(
        nvcc=settings.nvcc_path,
        arch_flags=extra_arch or db_arch or (f"-arch={settings.arch}",),
        flags=tuple(flags),
        timeout_s=settings.compile_timeout_s,
        flags_source="compile_commands.json" if db.flags is not None else "settings",
        problems=(db.problem,) if db.problem else (),
        notices=(dropped_flags_message(db),) if db.dropped else (),
    )


@dataclass(frozen=True)
class CompileResult:
    messages: tuple[CompilerMessage, ...]
    """Errors, warnings and notes; ``path`` is the document's path for messages about it."""
    resources: Mapping[str, ResourceUsage] = field(default_factory=lambda: MappingProxyType({}))
    """ptxas resource usage by demangled qualified kernel name (``ns::kern<float>``; ``extern "C"`` names as is),
    for the target architecture (the first one ptxas reported when the flags name several)."""
    by_base_name: Mapping[str, ResourceUsage] = field(default_factory=lambda: MappingProxyType({}))
    """The same records by base name (``kern``), first instance wins; what the kernel index matches on."""
    entries: tuple[str, ...] = ()
    """Kernel entry names in the cubin, mangled as the linker sees them, in ptxas's order."""
    cubin_path: str | None = None
    """The cubin, when the caller's folder outlives the compile (the verifier's, the profiler's); else None."""
    log: str = ""
    """nvcc's output with the scratch folder's paths removed ("candidate.cu(9): error ..."), or why it did not run."""
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


def dropped_flags_message(db: DbFlags) -> CompilerMessage:
    """One warning naming every flag of the compile database that the flag policy refused, and why."""
    items = "; ".join(f"'{d.flag}' ({d.reason})" for d in db.dropped)
    return CompilerMessage(None, None, None, "warning", "flags-dropped",
                           f"{db.db_path}: flags not passed to nvcc: {items}", tool="kernel-lsp")


def _map_file(message: CompilerMessage, temp_names: set[str], document_path: str) -> CompilerMessage:
    if message.path is not None and message.path in temp_names:
        return dataclasses.replace(message, path=document_path)
    return message


def compile_in(
    source: str | bytes,
    workdir: str,
    file_name: str,
    flags: BuildFlags,
    *,
    document_path: str | None = None,
    cancel: threading.Event | None = None,
) -> CompileResult:
    """Write ``source`` to ``workdir/file_name`` and compile it there to ``<stem>.cubin`` with ``flags``.

    Messages about the scratch file name ``document_path`` instead (when given).
    The cubin stays in ``workdir``: the caller's folder decides how long it lives.
    """
    argv = flags.argv(file_name)
    data = source.encode("utf-8", errors="replace") if isinstance(source, str) else source
    temp_path = os.path.join(workdir, file_name)
    cubin_path = os.path.join(workdir, (Path(file_name).stem or "buffer") + ".cubin")
    with open(temp_path, "wb") as handle:
        handle.write(data)
    common = dict(argv=tuple(argv), flags_source=flags.flags_source, problems=flags.problems)
    start = time.monotonic()
    try:
        result = proc.run(argv, timeout_s=flags.timeout_s, cwd=workdir, cancel=cancel)
    except proc.ToolMissing:
        missing = (f"nvcc was not found ('{flags.nvcc}'): compiler diagnostics and register counts are off. "
                   "Install the CUDA toolkit or set kernelLsp.nvccPath.")
        return CompileResult(messages=flags.notices, wall_s=time.monotonic() - start, tool_missing=missing, log=missing,
                             **common)
    problems = flags.problems
    if result.timed_out:
        problems += (
            f"nvcc did not finish within {flags.timeout_s:g} s and was stopped "
            "(setting compileTimeoutS); diagnostics were not updated.",
        )
    text = result.stderr + "\n" + result.stdout
    temp_names = {file_name, temp_path, os.path.realpath(temp_path), "./" + file_name}
    messages = parse_diagnostics(text)
    if document_path is not None:
        messages = tuple(_map_file(m, temp_names, document_path) for m in messages)
    messages = flags.notices + messages
    usages = parse_resource_usage(text)
    resources: dict[str, ResourceUsage] = {}
    by_base: dict[str, ResourceUsage] = {}
    target = flags.target_arch
    for usage in sorted(usages, key=lambda u: u.arch != target):  # the target arch first, order kept
        resources.setdefault(usage.qualified_name, usage)
        by_base.setdefault(usage.base_name, usage)
    # Paths of the scratch folder mean nothing to the user: "candidate.cu(9): error" reads better.
    log = (result.stdout + result.stderr).strip().replace(workdir + os.sep, "")
    if result.timed_out:
        log = f"nvcc did not finish in {flags.timeout_s:.0f} s"
    elif not log and result.returncode != 0:
        log = f"nvcc exited with {result.returncode}"
    built = result.ok and not result.timed_out and os.path.exists(cubin_path)
    return CompileResult(
        messages=messages,
        resources=MappingProxyType(resources),
        by_base_name=MappingProxyType(by_base),
        entries=tuple(dict.fromkeys(u.mangled_name for u in usages)),
        cubin_path=cubin_path if built else None,
        log=log,
        wall_s=result.wall_s,
        timed_out=result.timed_out,
        cancelled=result.cancelled,
        returncode=result.returncode,
        argv=result.argv,
        flags_source=flags.flags_source,
        problems=problems,
    )


def compile_source(
    source: str | bytes,
    document_path: str,
    settings: Settings | None = None,
    *,
    flags: BuildFlags | None = None,
    workspace_root: str | None = None,
    compile_db: CompileDb | None = None,
    cancel: threading.Event | None = None,
) -> CompileResult:
    """Compile ``source`` as if it were the file at ``document_path``, in a scratch folder removed afterwards.

    ``flags`` (from :func:`build_flags`, as the session resolves them) or else ``settings``.
    """
    if flags is None:
        flags = build_flags(settings or Settings(), document_path, workspace_root=workspace_root, compile_db=compile_db)
    file_name = os.path.basename(document_path) or "buffer.cu"
    with tempfile.TemporaryDirectory(prefix="kernel-lsp-") as tmp:
        result = compile_in(source, tmp, file_name, flags, document_path=document_path, cancel=cancel)
    return dataclasses.replace(result, cubin_path=None)
