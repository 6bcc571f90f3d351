"""Flags for one file from the workspace's ``compile_commands.json``.

The database is looked for in the file's folder and each parent up to the
workspace root, in each folder directly and under ``build/``. The database is
untrusted input (it comes with a cloned repository), so its arguments pass an
allow-list of flag forms (:func:`filter_flags`): include folders, macros, the
language standard, architectures, device code generation and warnings. Nothing
kept can choose or wrap a program (``-ccbin`` passes only for compilers matching
the user-level setting ``allowedCompilers``, like clangd's ``--query-driver``),
read a file outside the workspace (``-include``) or read more arguments from a
file (``@file``), and no value kept holds text the shell nvcc runs its host
compiler through would act on (:mod:`kernel_lsp.core.argv_policy`); every flag
refused is reported with why (:attr:`DbFlags.dropped`). Settings' ``extraFlags``
pass the same policy (:func:`kernel_lsp.services.toolchain.build_flags`). Output, dependency and input-file arguments are left
out without a word because the compiler service chooses its own.

A malformed database is a value (:attr:`DbFlags.problem`), never an exception:
the caller falls back to settings and shows the message once.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

from kernel_lsp.core.argv_policy import path_matches, safe_flags, shell_problem

log = logging.getLogger(__name__)

DB_NAME = "compile_commands.json"

#: Largest database read, in bytes: a bigger file is refused with a message rather than read into memory.
MAX_DB_BYTES = 256 * 1024 * 1024

# --- the flag policy ------------------------------------------------------------------------------
# An allow-list of flag *forms*: anything not described here is dropped. A workspace's database is
# untrusted input (a cloned repository writes it), so a kept flag must not be able to choose or wrap a
# program (the host compiler, a linker, a wrapper, a plugin), read a file outside the workspace, or
# write a file. Search folders (-I) may point anywhere: they are read only when the source includes
# a file, which the source can do by itself.

#: Flags whose value follows as the next argument or after ``=``; the value's kind decides the check.
_VALUE_FLAGS: dict[str, str] = {
    **dict.fromkeys(("-I", "--include-path", "-isystem", "--system-include"), "dir"),
    **dict.fromkeys(("-include", "--pre-include"), "include"),
    **dict.fromkeys(("-D", "--define-macro", "-U", "--undefine-macro"), "macro"),
    **dict.fromkeys(("-std", "--std"), "std"),
    **dict.fromkeys(("-arch", "--gpu-architecture", "-gencode", "--generate-code", "-code", "--gpu-code"), "arch"),
    **dict.fromkeys(("-maxrregcount", "--maxrregcount"), "count"),
    **dict.fromkeys(("-rdc", "--relocatable-device-code", "-ftz", "--ftz", "-prec-div", "--prec-div",
                     "-prec-sqrt", "--prec-sqrt", "-fmad", "--fmad"), "bool"),
    **dict.fromkeys(("-default-stream", "--default-stream"), "stream"),
    **dict.fromkeys(("-x", "--x"), "lang"),
    **dict.fromkeys(("-diag-suppress", "--diag-suppress", "-diag-warn", "--diag-warn", "-diag-error",
                     "--diag-error"), "diag"),
    **dict.fromkeys(("-Xcompiler", "--compiler-options"), "host"),
    **dict.fromkeys(("-Xptxas", "--ptxas-options"), "ptxas"),
    **dict.fromkeys(("-ccbin", "--compiler-bindir"), "compiler"),
    # Output choices: kernel-lsp picks its own (-cubin into a temporary folder); dropped without a word.
    **dict.fromkeys(("-o", "--output-file", "-MF", "-MT", "-MQ", "--dependency-output", "-odir",
                     "--output-directory"), "ours"),
    # Known to take a value, not passed on: the value is dropped with the flag.
    **dict.fromkeys(("-Xlinker", "--linker-options", "-Xnvlink", "--nvlink-options", "-Xarchive",
                     "--archive-options", "-Xfatbin", "--fatbin-options", "-optf", "--options-file", "-l",
                     "--library", "-L", "--library-path", "-ldir", "--libdevice-directory", "-keep-dir",
                     "--keep-dir", "-run-args", "--run-args", "-time", "--time", "-t", "--threads",
                     "-split-compile", "--split-compile", "-Werror", "--Werror"), "other"),
}
#: Flags with their value attached and no separator (``-Idir``, ``-DNAME=1``).
_ATTACHED = ("-I", "-isystem", "-D", "-U")
_VALUE_RE = {
    "macro": re.compile(r"[A-Za-z_]\w*(\(.*\))?(=.*)?", re.S),
    "std": re.compile(r"(c|gnu)\+\+\w{2}"),
    "arch": re.compile(r"[A-Za-z0-9_,=\[\]]+"),
    "count": re.compile(r"\d{1,4}"),
    "bool": re.compile(r"true|false"),
    "stream": re.compile(r"legacy|null|per-thread"),
    "lang": re.compile(r"cu"),
    "diag": re.compile(r"[A-Za-z0-9_-]+(,[A-Za-z0-9_-]+)*"),
}
#: Single-argument flags passed on (device code generation, language extensions, warnings).
_SINGLE = re.compile(
    r"--?(expt-relaxed-constexpr|expt-extended-lambda|extended-lambda|use_fast_math|restrict|lineinfo"
    r"|generate-line-info|device-debug|disable-warnings|G|g|w|rdc)"
    r"|-O[0-3]|--?W(no-)?[a-z][a-z0-9-]{2,}"
)
#: Single flags about the output (kernel-lsp chooses its own): dropped without a word.
_OURS_SINGLE = re.compile(
    r"-c|--compile|--?cubin|--?ptx|--?fatbin|-M|-MD|-MMD|-MM|-MP|-E|-S|-dc|--device-c|-dw|--device-w"
    r"|-lib|--lib|-dlink|--device-link|-shared|--shared|-o.+|-MF.+|-MT.+|-MQ.+"
)
#: Host-compiler options passed on through ``-Xcompiler`` (each comma-separated item): code generation
#: and warnings only. Options such as ``-wrapper``, ``-B``, ``-fplugin``, ``-specs`` or ``-Wp,`` would
#: let the database run or load a program, so they are not here.
_HOST_ITEM = re.compile(
    r"-f(PIC|pic|PIE|pie|openmp|no-strict-aliasing|strict-aliasing|exceptions|no-exceptions|fast-math"
    r"|no-omit-frame-pointer|omit-frame-pointer|permissive|visibility=(hidden|default)"
    r"|diagnostics-color(=(always|never|auto))?)"
    r"|-W(no-)?[a-z][a-z0-9+-]{2,}(=\d+)?|-O[0-3sg]?|-g[0-3]?|-w|-pthread|-std=(c|gnu)\+\+\w{2}"
    r"|-m(64|32|avx|avx2|avx512\w*|sse[0-9.]*|fma|arch=[\w-]+|tune=[\w-]+)"
    r"|-D[A-Za-z_]\w*(=[\w.+-]*)?|-U[A-Za-z_]\w*"
    r"|/(W[0-4]|MDd?|MTd?|EHsc|bigobj|permissive-|Zc:\w+|std:c\+\+\w+|wd\d+)"
)
#: ptxas options passed on through ``-Xptxas``.
_PTXAS_ITEM = re.compile(
    r"-v|--verbose|-O[0-3]|--?maxrregcount=\d{1,4}|-warn-spills|--warn-on-spills|-warn-lmem-usage"
    r"|--warn-on-local-memory-usage|-dlcm=c[ag]|-dscm=(cg|cs|wb|wt)|--allow-expensive-optimizations=(true|false)"
)


@dataclass(frozen=True)
class DroppedFlag:
    """A flag of the database that kernel-lsp did not pass on to nvcc."""

    flag: str
    """The flag as written, with its value (``-ccbin /opt/evil``)."""
    reason: str


@dataclass(frozen=True)
class FlagFilter:
    kept: tuple[str, ...]
    """Flags passed on, relative paths made absolute."""
    dropped: tuple[DroppedFlag, ...]
    """Flags refused, each with why (output choices and input files are left out without a word)."""


def _inside(path: str, root: str) -> bool:
    real, real_root = os.path.realpath(path), os.path.realpath(root)
    return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)


def compiler_allowed(value: str, directory: str, patterns: tuple[str, ...]) -> str | None:
    """The host compiler ``value`` names, as the path nvcc is given, when one of ``patterns`` allows it; else None.

    Like clangd's ``--query-driver``: the patterns come from the user's own settings, never the workspace.
    A pattern is matched (:func:`~kernel_lsp.core.argv_policy.path_matches`, ``*`` within one path segment)
    against the compiler's real path, and against its name in its folder's real path: Debian's
    ``/usr/bin/g++-12`` is a link to ``x86_64-linux-gnu-g++-12``, and ``/usr/bin/g++-*`` names the link.
    Neither form holds ``..`` or a link of the workspace's, so ``/usr/bin/../../repo/cc`` is ``/repo/cc``.
    A folder (``--compiler-bindir=/usr/bin``) is matched as it is named. The form that matched is what nvcc
    runs, so the program checked is the program run.
    """
    if not patterns:
        return None
    if os.sep in value or (os.altsep and os.altsep in value):
        found: str | None = _absolute(value, directory)
    else:
        found = shutil.which(value)
    if not found:
        return None
    real = os.path.realpath(found)
    in_real_folder = os.path.join(os.path.realpath(os.path.dirname(found)), os.path.basename(found))
    for form in (in_real_folder, real):
        if any(path_matches(form, pattern) for pattern in patterns) and shell_problem(form) is None:
            return form
    return None


def filter_flags(args: list[str], directory: str, trust_root: str,
                 allowed_compilers: tuple[str, ...] = ()) -> FlagFilter:
    """Apply the flag policy to a compile command's arguments (without argv[0]).

    ``directory`` resolves relative paths; ``trust_root`` is the folder a forced include (``-include``)
    must lie in; ``allowed_compilers`` are the user's glob patterns for ``-ccbin``.
    """
    kept: list[str] = []
    dropped: list[DroppedFlag] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg.startswith("@"):
            dropped.append(DroppedFlag(arg, "a response file: its arguments would be read from another file"))
            continue
        if not arg.startswith("-") or arg == "-":
            continue  # an input file (the source itself): kernel-lsp passes its own
        name, eq, attached = arg.partition("=")
        kind = _VALUE_FLAGS.get(name) if eq else None
        joined = False
        if kind is not None:
            value: str | None = attached
        elif arg in _VALUE_FLAGS:
            kind = _VALUE_FLAGS[arg]
            name = arg
            value = args[i] if i < len(args) else None
            i += value is not None
        elif arg.startswith(_ATTACHED):
            name = next(p for p in sorted(_ATTACHED, key=len, reverse=True) if arg.startswith(p))
            kind, value, joined = _VALUE_FLAGS[name], arg[len(name):], True
        else:
            if _SINGLE.fullmatch(arg):
                kept.append(arg)
            elif _OURS_SINGLE.fullmatch(arg) is None:
                dropped.append(DroppedFlag(arg, "not among the flags kernel-lsp takes from compile_commands.json"))
            continue
        written = f"{name} {value}" if value is not None else name
        if value is None:
            dropped.append(DroppedFlag(written, "has no value"))
            continue
        verdict = _check_value(kind, name, value, directory, trust_root, allowed_compilers)
        if joined and isinstance(verdict, list):
            verdict = ["".join(verdict)]
        if isinstance(verdict, list):
            unsafe = safe_flags(verdict)[1]
            if unsafe:
                verdict = DroppedFlag(written, unsafe[0][1])
        if isinstance(verdict, DroppedFlag):
            # Named as written: "-DX=1", "--define-macro=X", or the flag and its value "-I dir".
            dropped.append(DroppedFlag(arg if joined or eq else written, verdict.reason))
        elif verdict is not None:
            kept += verdict
    return FlagFilter(tuple(kept), tuple(dropped))


def _check_value(kind: str | None, name: str, value: str, directory: str, trust_root: str,
                 allowed_compilers: tuple[str, ...]) -> list[str] | DroppedFlag | None:
    """The arguments to keep for one flag and its value, a :class:`DroppedFlag`, or None (dropped silently)."""
    written = f"{name} {value}"
    if kind == "ours":
        return None
    if kind == "other" or kind is None:
        return DroppedFlag(written, "not among the flags kernel-lsp takes from compile_commands.json")
    if kind == "dir":
        return [name, _absolute(value, directory)] if value else DroppedFlag(written, "has no value")
    if kind == "include":
        path = _absolute(value, directory)
        if not _inside(path, trust_root):
            return DroppedFlag(written, f"reads a file outside the workspace ({trust_root})")
        return [name, path]
    if kind == "compiler":
        found = compiler_allowed(value, directory, allowed_compilers)
        if found is None:
            why = ("chooses the host compiler program; allowed only for compilers matching the user setting "
                   "kernelLsp.allowedCompilers" + ("" if allowed_compilers else " (not set)"))
            return DroppedFlag(written, why)
        return [name, found]
    if kind in ("host", "ptxas"):
        item_re = _HOST_ITEM if kind == "host" else _PTXAS_ITEM
        bad = [item for item in value.split(",") if not item_re.fullmatch(item.strip())]
        if bad:
            what = "host-compiler" if kind == "host" else "ptxas"
            return DroppedFlag(written, f"{what} option {bad[0]!r} is not among the code-generation and warning "
                                        "options kernel-lsp passes on (others can run or load a program)")
        return [name, value]
    if _VALUE_RE[kind].fullmatch(value) is None:
        return DroppedFlag(written, f"value {value!r} is not a plain {kind} value")
    return [f"{name}={value}"] if kind in ("std", "arch", "count", "bool", "stream", "diag") else [name, value]

@dataclass(frozen=True)
class DbFlags:
    """The outcome of a database look-up for one file."""

    db_path: str | None
    """The database consulted, or None when the workspace has none."""
    flags: tuple[str, ...] | None
    """Kept flags with relative paths made absolute; None when the file has no entry (or no usable database)."""
    directory: str | None = None
    """The entry's working directory."""
    problem: str | None = None
    """Why the database could not be used (malformed JSON, wrong shape), for the user."""
    dropped: tuple[DroppedFlag, ...] = ()
    """Flags of the entry that the flag policy refused, each with why."""


def find_db(file_path: str | os.PathLike[str], workspace_root: str | os.PathLike[str] | None) -> Path | None:
    """The nearest ``compile_commands.json`` from the file's folder up to ``workspace_root``."""
    folder = Path(file_path).resolve().parent
    root = Path(workspace_root).resolve() if workspace_root else None
    while True:
        for candidate in (folder / DB_NAME, folder / "build" / DB_NAME):
            if candidate.is_file():
                return candidate
        if root is None or folder == root or folder.parent == folder or root not in folder.parents:
            return None
        folder = folder.parent


class CompileDb:
    """Loads databases lazily and caches them by (path, mtime, size).

    ``trust_workspace``: a forced include may lie anywhere in the workspace root (the folder the
    user opened in the editor). Without it (``kernel-lsp check``, whose root is merely the current
    folder, perhaps the home folder) it must lie in the database's own project folder.
    """

    def __init__(self, *, trust_workspace: bool = True) -> None:
        self._trust_workspace = trust_workspace
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[tuple[float, int], list[dict] | str]] = {}

    def flags_for(self, file_path: str, workspace_root: str | None,
                  allowed_compilers: tuple[str, ...] = ()) -> DbFlags:
        """The filtered flags of ``file_path``'s entry; ``allowed_compilers`` come from user-level settings."""
        db = find_db(file_path, workspace_root)
        if db is None:
            return DbFlags(None, None)
        entries = self._load(db)
        if isinstance(entries, str):
            return DbFlags(str(db), None, problem=entries)
        target = os.path.realpath(file_path)
        for entry in entries:
            directory = entry.get("directory")
            directory = directory if isinstance(directory, str) and directory else str(db.parent)
            name = entry.get("file")
            if not isinstance(name, str):
                continue
            if os.path.realpath(os.path.join(directory, name)) != target:
                continue
            argv = _entry_argv(entry)
            if argv is None:
                return DbFlags(str(db), None, directory, problem=f"{db}: entry for {name} has no 'arguments' or 'command'")
            root = _trust_root(db, workspace_root if self._trust_workspace else None)
            result = filter_flags(argv[1:], directory, root, allowed_compilers)
            return DbFlags(str(db), result.kept, directory, dropped=result.dropped)
        return DbFlags(str(db), None)

    def _load(self, db: Path) -> list[dict] | str:
        try:
            stat = db.stat()
        except OSError as exc:
            return f"{db}: cannot read ({exc.strerror})"
        stamp = (stat.st_mtime, stat.st_size)
        key = str(db)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None and cached[0] == stamp:
                return cached[1]
        loaded = _parse_db(db)
        if isinstance(loaded, str):
            log.warning("%s", loaded)
        with self._lock:
            self._cache[key] = (stamp, loaded)
        return loaded


def _trust_root(db: Path, workspace_root: str | None) -> str:
    """The folder a database's forced includes must lie in: the workspace, or the database's project folder."""
    if workspace_root and _inside(str(db), workspace_root):
        return workspace_root
    return str(db.parent.parent if db.parent.name == "build" else db.parent)


def _parse_db(db: Path) -> list[dict] | str:
    try:
        if db.stat().st_size > MAX_DB_BYTES:
            return f"{db} is larger than {MAX_DB_BYTES >> 20} MB; using kernel-lsp settings instead"
        data = json.loads(db.read_text(encoding="utf-8", errors="replace"))
    except RecursionError:
        return f"{db} is nested too deeply to read; using kernel-lsp settings instead"
    except OSError as exc:
        return f"{db} cannot be read ({exc.strerror}); using kernel-lsp settings instead"
    except ValueError as exc:
        return f"{db} is not valid JSON ({exc}); using kernel-lsp settings instead"
    if not isinstance(data, list) or not all(isinstance(e, dict) for e in data):
        return f"{db} must be a JSON array of objects; using kernel-lsp settings instead"
    return data


def _entry_argv(entry: dict) -> list[str] | None:
    arguments = entry.get("arguments")
    if isinstance(arguments, list) and all(isinstance(a, str) for a in arguments) and arguments:
        return list(arguments)
    command = entry.get("command")
    if isinstance(command, str) and command.strip():
        try:
            return shlex.split(command)
        except ValueError:
            return None
    return None


def _absolute(value: str, directory: str) -> str:
    return value if os.path.isabs(value) else os.path.normpath(os.path.join(directory, value))


def keep_flags(args: list[str], directory: str, source_path: str) -> tuple[str, ...]:
    """The flags of a compile command (without argv[0]) that kernel-lsp passes on (see :func:`filter_flags`)."""
    return filter_flags(args, directory, os.path.dirname(source_path) or directory).kept
