"""nvcc: one set of build flags and one compile for every nvcc run kernel-lsp makes.

:class:`BuildFlags` is what every nvcc run of a file uses (diagnostics, the
verifier, the profiler's build, the model's compile tool), resolved once by
:func:`build_flags`: the workspace's ``compile_commands.json`` when it lists the
file, else the settings, then always the file's own folder and the settings'
include paths and ``extraFlags``:

    nvcc <arch flags> -cubin -Xptxas -v -lineinfo [flags] -I <folder> [-I include_paths] [extraFlags] -o buffer.cubin buffer.cu

Nothing on that line may hold text the shell nvcc runs its host compiler through
would act on (:mod:`kernel_lsp.core.argv_policy`): ``extraFlags`` from any settings
layer pass the compile database's flag policy (initializationOptions too: the VS
Code extension fills them from settings a workspace can set), include paths the
shell check, and each dropped flag is a warning that names it.

:func:`compile_source` writes the text (saved or not) as ``buffer.cu`` in a private
scratch folder and compiles it there to ``buffer.cubin`` (never the document's own
name, which a cloned repository chooses); ``-I <folder>`` makes
``#include "local.cuh"`` resolve as in the user's build, through a link named
``include-<hash>`` in the scratch folder when the folder's own path holds such text. The
user's file is never touched; messages that name the scratch file or the link are
mapped back to the document's paths. nvcc's output is read up to
:data:`MAX_OUTPUT_BYTES` (its start and its end, where ptxas reports), and at most
:data:`~kernel_lsp.core.nvcc_output.MAX_MESSAGES` diagnostics are kept with a
count of the rest. The one
:class:`CompileResult` carries the diagnostics, the ptxas resource usage and the
entry names (both read once from ptxas's verbose output), and the cubin. Every
failure is a value (missing nvcc, timeout, cancel), never an exception.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import MappingProxyType

from kernel_lsp.config import Settings
from kernel_lsp.core.argv_policy import safe_flags, shell_problem
from kernel_lsp.core.launch_dims import defines_from_flags
from kernel_lsp.core.nvcc_output import CompilerMessage, ResourceUsage, parse_resource_usage, read_diagnostics
from kernel_lsp.services import proc
from kernel_lsp.services.compile_db import CompileDb, DbFlags, DroppedFlag, filter_flags

log = logging.getLogger(__name__)

#: The scratch copy of the buffer and its output, in a private folder: fixed names, never the document's.
SCRATCH_SOURCE = "buffer.cu"
#: nvcc's output kept per stream, in bytes: its first 8 MiB and its last 2 MiB (ptxas's resource report
#: comes last). A 66 KB line of 4,400 ``__global__ int;`` made nvcc print 1.36 GB, each of its 8,800
#: warnings echoing the whole line.
MAX_OUTPUT_BYTES = (8 << 20, 2 << 20)
#: nvcc is stopped once it has printed this much (what follows would not be read anyway): the 1.36 GB of
#: the line above took nvcc 5.5 s to print, and a compile's time should not grow with its output.
STOP_AFTER_OUTPUT_BYTES = 64 << 20

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
    """Diagnostics about the flags themselves (compile-database or settings flags the policy dropped), shown
    with every compile's messages."""
    linked_folders: tuple[str, ...] = ()
    """``-I`` folders of ``flags`` that kernel-lsp adds itself (the file's own folder) whose path the shell
    would act on: each compile reaches such a folder through a link with a plain name in its scratch folder."""

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

    def argv(self, file_name: str, links: Mapping[str, str] | None = None) -> list[str]:
        """The nvcc command that compiles ``file_name`` (in the current folder) to ``<stem>.cubin``;
        ``links``: the path to pass for each of :attr:`linked_folders`."""
        argv = [self.nvcc, *self.arch_flags, "-cubin", "-Xptxas", "-v", "-lineinfo"]
        if not file_name.endswith(".cu"):
            # nvcc picks the language from the suffix and rejects .cuh; headers and scratch buffers are CUDA.
            argv += ["-x", "cu"]
        flags = list(self.flags)
        for i in range(len(flags) - 1):
            if links and flags[i] == "-I" and flags[i + 1] in links:
                flags[i + 1] = links[flags[i + 1]]
        argv += flags
        stem = Path(file_name).stem or "buffer"
        return argv + ["-o", f"{stem}.cubin", file_name]


def settings_flags(settings: Settings, workspace_root: str | None) -> tuple[tuple[str, ...], tuple[tuple[str, DroppedFlag], ...]]:
    """(``-I`` include paths then ``extraFlags`` as nvcc gets them, (setting, dropped flag) for the others):
    ``extraFlags`` pass the compile database's flag policy whatever settings layer gave them (a forced include
    must lie in the workspace, ``-ccbin`` needs ``allowedCompilers``), include paths the shell check."""
    folder = workspace_root or os.getcwd()
    extra = filter_flags(list(settings.extra_flags), folder, folder, settings.allowed_compilers)
    includes: list[str] = []
    dropped: list[tuple[str, DroppedFlag]] = []
    for path in settings.include_paths:
        why = shell_problem(path)
        if why is None:
            includes += ["-I", path]
        else:
            dropped.append(("includePaths", DroppedFlag(path, why)))
    dropped += [("extraFlags", d) for d in extra.dropped]
    return tuple(includes) + extra.kept, tuple(dropped)


def build_flags(
    settings: Settings, document_path: str, *, workspace_root: str | None = None, compile_db: CompileDb | None = None,
) -> BuildFlags:
    """The flags of every nvcc run for ``document_path`` (see the module docstring)."""
    folder = os.path.dirname(os.path.abspath(document_path)) or os.getcwd()
    db = (compile_db or CompileDb()).flags_for(document_path, workspace_root, settings.allowed_compilers)
    db_arch, db_rest = split_arch_flags(db.flags or ())
    from_settings, settings_dropped = settings_flags(settings, workspace_root)
    extra_arch, extra_rest = split_arch_flags(from_settings)
    notices = []
    if db.dropped:
        notices.append(dropped_flags_message(db))
    if settings_dropped:
        items = "; ".join(f"{key} '{d.flag}' ({d.reason})" for key, d in settings_dropped)
        notices.append(CompilerMessage(None, None, None, "warning", "flags-dropped",
                                       f"settings: flags not passed to nvcc: {items}", tool="kernel-lsp"))
    return BuildFlags(
        nvcc=settings.nvcc_path,
        arch_flags=extra_arch or db_arch or (f"-arch={settings.arch}",),
        flags=(*db_rest, "-I", folder, *extra_rest),
        timeout_s=settings.compile_timeout_s,
        flags_source="compile_commands.json" if db.flags is not None else "settings",
        problems=(db.problem,) if db.problem else (),
        notices=tuple(notices),
        linked_folders=(folder,) if shell_problem(folder) else (),
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


def _map_file(message: CompilerMessage, temp_names: set[str], links: Mapping[str, str],
              document_path: str | None) -> CompilerMessage:
    """``message`` about the document's path instead of the scratch file's, and about a linked folder's
    real path instead of its link's."""
    path = message.path
    if path is None:
        return message
    if path in temp_names:
        return dataclasses.replace(message, path=document_path) if document_path is not None else message
    for link, folder in links.items():
        if path.startswith(link + os.sep):
            return dataclasses.replace(message, path=folder + path[len(link):])
    return message


def _refused(flags: BuildFlags, argv: list[str], why: str) -> CompileResult:
    """The compile not run: its command line held text nvcc's shell would act on."""
    message = CompilerMessage(None, None, None, "error", "unsafe-argument", why, tool="kernel-lsp")
    return CompileResult(messages=flags.notices + (message,), log=why, argv=tuple(argv),
                         flags_source=flags.flags_source, problems=flags.problems + (why,))


class _InFlight:
    """Compiles running now, by what decides their result (text, name, flags, document path).

    A save starts the diagnostics' compile and, a debounce later, the profiler's compile of the same
    text with the same flags (one command and one :class:`CompileResult` for both, by design): the
    second waits for the first and takes its result and a copy of its cubin instead of running nvcc
    again. Compiles that do not overlap share through :class:`_Finished` instead.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[tuple, tuple[threading.Event, list]] = {}

    def join_or_lead(self, key: tuple) -> tuple[bool, threading.Event, list]:
        """(lead, done, box): the leader runs the compile and fills ``box`` with (result, cubin bytes)."""
        with self._lock:
            running = self._running.get(key)
            if running is not None:
                return False, running[0], running[1]
            done, box = threading.Event(), []
            self._running[key] = (done, box)
            return True, done, box

    def finish(self, key: tuple) -> None:
        with self._lock:
            done, _ = self._running.pop(key)
        done.set()


_IN_FLIGHT = _InFlight()


def _include_folders(argv: list[str]) -> list[str]:
    """The folders an ``#include`` is looked up in, from ``-I``/``-isystem`` (joined or separate)."""
    folders = []
    for i, arg in enumerate(argv):
        for flag in ("-I", "-isystem", "--include-path"):
            if arg == flag and i + 1 < len(argv):
                folders.append(argv[i + 1])
            elif arg.startswith(flag) and len(arg) > len(flag):
                folders.append(arg[len(flag):].lstrip("="))
    return folders


def read_dependencies(text: str, workdir: str) -> tuple[str, ...] | None:
    """The files a compile read, from nvcc's ``-MD`` output (``buffer.cubin : buffer.cu a.h \\ ...``), as
    real paths (a link in the scratch folder resolved to the user's folder); None when it cannot be read."""
    _, sep, rest = text.replace("\\\n", " ").partition(": ")
    if not sep:
        return None
    paths, word, escaped = [], "", False
    for char in rest:
        if escaped:
            word, escaped = word + char, False
        elif char == "\\":
            escaped = True
        elif char.isspace():
            if word:
                paths.append(word)
            word = ""
        else:
            word += char
    if word:
        paths.append(word)
    return tuple(os.path.realpath(os.path.join(workdir, path)) for path in paths)


def _stamp(path: str) -> tuple[int, int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_mtime_ns, info.st_size, info.st_ino)


def _shadowing(dependencies: tuple[str, ...], folders: list[str]) -> list[str]:
    """The paths a new header could appear at and be read instead of one of ``dependencies``: for each file
    read from under an include folder as ``name``, ``name`` in every include folder."""
    names = {os.path.relpath(path, folder) for path in dependencies for folder in folders
             if path.startswith(folder + os.sep)}
    return [os.path.join(folder, name) for name in sorted(names) for folder in folders]


@dataclass(frozen=True)
class _Reusable:
    """A finished compile, and what its result depended on besides its text and flags."""

    stamps: tuple[tuple[str, tuple[int, int, int] | None], ...]
    result: CompileResult
    cubin: bytes | None

    def still_valid(self) -> bool:
        return all(_stamp(path) == stamp for path, stamp in self.stamps)


class _Finished:
    """The last finished compiles, by the same key as :class:`_InFlight`, each reused while what it read is
    unchanged.

    The file opened is compiled for its diagnostics; the first save of the same text compiles it again,
    for the diagnostics and the profiler alike (the profile waits for it), and so does a save after
    ``compileOnChange`` already compiled what is saved. That compile is the largest part of a save's
    time to its profile. A result is reused only while every file nvcc read for it (its ``-MD`` list:
    local headers, the toolkit's, the system's) has the modification time, size and inode it had, each
    path of an ``-I`` folder where a header of the same name could appear in front of one read is as it
    was (absent, mostly), and nvcc itself is the same file. Folders' own times are not compared: an
    editor's swap and backup files change them all the time.
    A compile that timed out, was cancelled, could not run or left no dependency list is never kept.
    """

    LIMIT = 16
    #: Larger cubins are not kept in memory (the server's compiles are of one file; a verifier's candidates
    #: are small): a compile that makes one runs again.
    MAX_CUBIN_BYTES = 16 << 20

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done: dict[tuple, _Reusable] = {}

    def get(self, key: tuple) -> _Reusable | None:
        with self._lock:
            entry = self._done.get(key)
        if entry is None or not entry.still_valid():
            return None
        with self._lock:
            self._done.pop(key, None)
            self._done[key] = entry  # the most recently used last
        return entry

    def put(self, key: tuple, entry: _Reusable) -> None:
        with self._lock:
            self._done.pop(key, None)
            self._done[key] = entry
            while len(self._done) > self.LIMIT:
                self._done.pop(next(iter(self._done)))

    def clear(self) -> None:
        with self._lock:
            self._done.clear()


_FINISHED = _Finished()


def _reusable(result: CompileResult, cubin: bytes | None, dependencies: tuple[str, ...] | None, flags: BuildFlags,
              workdir: str) -> _Reusable | None:
    """What to keep of a finished compile in ``workdir`` (``cubin``: the bytes it wrote), or None. The scratch
    folder's own files (the buffer, whose text is part of the key) are not watched: the folder goes when its
    caller is done."""
    if dependencies is None or result.tool_missing is not None:
        return None
    if cubin is not None and len(cubin) > _Finished.MAX_CUBIN_BYTES:
        return None
    scratch = os.path.realpath(workdir) + os.sep
    folders = (os.path.realpath(os.path.join(workdir, folder)) for folder in _include_folders(list(flags.flags)))
    nvcc = shutil.which(flags.nvcc) or flags.nvcc
    watched = dict.fromkeys([os.path.realpath(nvcc), *dependencies, *_shadowing(dependencies, list(folders))])
    stamps = tuple((path, _stamp(path)) for path in watched if not (path + os.sep).startswith(scratch))
    return _Reusable(stamps=stamps, result=dataclasses.replace(result, cubin_path=None), cubin=cubin)


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

    ``file_name`` is the caller's fixed name (``buffer.cu``, ``candidate.cu``), never one a workspace
    chose. Messages about the scratch file name ``document_path`` instead (when given). Every argument
    is checked once more (:func:`~kernel_lsp.core.argv_policy.safe_flags`): one the shell would act on
    (a scratch folder under an odd ``TMPDIR``) stops the compile with an error, nothing runs.
    The cubin stays in ``workdir``: the caller's folder decides how long it lives. A compile of the same
    text, name and flags that is running at the same time is waited for and shared (:class:`_InFlight`);
    one that finished earlier is reused while nothing it read has changed (:class:`_Finished`).
    """
    data = source.encode("utf-8", errors="replace") if isinstance(source, str) else source
    key = (hashlib.sha256(data).digest(), file_name, flags, document_path)
    finished = _FINISHED.get(key)
    if finished is not None:
        return _shared(finished.result, finished.cubin, workdir, file_name)
    lead, done, box = _IN_FLIGHT.join_or_lead(key)
    if not lead:
        while not done.wait(0.05):
            if cancel is not None and cancel.is_set():
                break
        if box:
            return _shared(*box[0], workdir, file_name)
        # The leader was cancelled, failed to run or was given up on: compile here.
        return _compile_in(data, workdir, file_name, flags, document_path=document_path, cancel=cancel)
    try:
        result, dependencies = _compile_with_dependencies(data, workdir, file_name, flags,
                                                          document_path=document_path, cancel=cancel)
        if not (result.cancelled or result.timed_out):
            cubin = None
            if result.cubin_path is not None:
                with open(result.cubin_path, "rb") as handle:
                    cubin = handle.read()
            box.append((result, cubin))
            reusable = _reusable(result, cubin, dependencies, flags, workdir)
            if reusable is not None:
                _FINISHED.put(key, reusable)
        return result
    finally:
        _IN_FLIGHT.finish(key)


def _shared(result: CompileResult, cubin: bytes | None, workdir: str, file_name: str) -> CompileResult:
    """Another compile's result as this caller's: its cubin copied into this caller's folder."""
    if cubin is None:
        return result
    cubin_path = os.path.join(workdir, (Path(file_name).stem or "buffer") + ".cubin")
    with open(cubin_path, "wb") as handle:
        handle.write(cubin)
    return dataclasses.replace(result, cubin_path=cubin_path)


def _compile_with_dependencies(
    data: bytes,
    workdir: str,
    file_name: str,
    flags: BuildFlags,
    *,
    document_path: str | None,
    cancel: threading.Event | None,
) -> tuple[CompileResult, tuple[str, ...] | None]:
    """The compile, with nvcc asked for the files it read (``-MD -MF``; the flag policy drops a database's or
    a setting's own dependency flags): (the result, those files' real paths, or None)."""
    deps_name = (Path(file_name).stem or "buffer") + ".d"
    deps_path = os.path.join(workdir, deps_name)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(deps_path)  # a stale list from an earlier compile in the same folder is never read
    result = _compile_in(data, workdir, file_name, flags, document_path=document_path, cancel=cancel,
                         dependency_file=deps_name)
    try:
        with open(deps_path, encoding="utf-8", errors="surrogateescape") as handle:
            return result, read_dependencies(handle.read(), workdir)
    except OSError:
        return result, None


def _compile_in(
    data: bytes,
    workdir: str,
    file_name: str,
    flags: BuildFlags,
    *,
    document_path: str | None,
    cancel: threading.Event | None,
    dependency_file: str | None = None,
) -> CompileResult:
    links: dict[str, str] = {}
    for folder in flags.linked_folders:
        # Named by the folder, so a second compile in the same folder (the verifier's candidates) finds it.
        link = os.path.join(workdir, "include-" + hashlib.sha256(folder.encode()).hexdigest()[:12])
        if not os.path.islink(link):
            os.symlink(folder, link, target_is_directory=True)
        links[folder] = link
    argv = flags.argv(file_name, links)
    if dependency_file is not None:
        argv[-3:-3] = ["-MD", "-MF", dependency_file]
    unsafe = safe_flags(argv[1:])[1]
    if unsafe:
        flag, why = unsafe[0]
        return _refused(flags, argv, f"nvcc was not run: its argument '{flag}' {why}")
    temp_path = os.path.join(workdir, file_name)
    cubin_path = os.path.join(workdir, (Path(file_name).stem or "buffer") + ".cubin")
    with open(temp_path, "wb") as handle:
        handle.write(data)
    common = dict(argv=tuple(argv), flags_source=flags.flags_source, problems=flags.problems)
    start = time.monotonic()
    try:
        result = proc.run(argv, timeout_s=flags.timeout_s, cwd=workdir, cancel=cancel,
                          max_output_bytes=MAX_OUTPUT_BYTES, stop_after_bytes=STOP_AFTER_OUTPUT_BYTES)
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
    parsed = read_diagnostics(text)
    messages = tuple(_map_file(m, temp_names, {v: k for k, v in links.items()}, document_path) for m in parsed.messages)
    more = parsed.more
    if result.output_overflow:
        stopped = (f"nvcc printed more than {STOP_AFTER_OUTPUT_BYTES >> 20} MB and was stopped: "
                   f"{len(parsed.messages)} of its diagnostics are shown, and no resource usage")
        problems += (stopped,)
        messages += (CompilerMessage(None, None, None, "warning", "output-cut", stopped, tool="kernel-lsp"),)
    elif result.skipped_bytes:
        more_text = f"{more} more diagnostics, and " if more else ""
        messages += (CompilerMessage(None, None, None, "warning", "output-cut",
                                     f"nvcc printed {result.skipped_bytes / 2**20:.0f} MB more than kernel-lsp reads "
                                     f"({more_text}whatever they held, are not shown)", tool="kernel-lsp"),)
    elif more:
        messages += (CompilerMessage(None, None, None, "info", "more-messages",
                                     f"{more} more diagnostics from nvcc are not shown", tool="kernel-lsp"),)
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
    with tempfile.TemporaryDirectory(prefix="kernel-lsp-") as tmp:
        result = compile_in(source, tmp, SCRATCH_SOURCE, flags, document_path=document_path, cancel=cancel)
    return dataclasses.replace(result, cubin_path=None)
