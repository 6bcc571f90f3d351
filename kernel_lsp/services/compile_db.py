"""Flags for one file from the workspace's ``compile_commands.json``.

The database is looked for in the file's folder and each parent up to the
workspace root, in each folder directly and under ``build/``. Only the flags
that change how the file is *parsed and compiled for the device* are kept
(``-I``, ``-D``, ``-U``, ``-include``, ``-isystem``, ``-std``, architecture and
``--expt-*`` flags, ``-x``, ``-rdc``); output, dependency and input-file
arguments are dropped because the compiler service chooses its own.

A malformed database is a value (:attr:`DbFlags.problem`), never an exception:
the caller falls back to settings and shows the message once.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import threading
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

DB_NAME = "compile_commands.json"

#: Flags followed by a separate value that we keep (``-I dir``).
_KEEP_WITH_VALUE = {
    "-I", "-D", "-U", "-include", "-isystem", "-std", "-arch", "--gpu-architecture", "-gencode",
    "--generate-code", "--include-path", "--define-macro", "--undefine-macro", "--pre-include",
    "--system-include", "-ccbin", "--compiler-bindir", "-maxrregcount", "--maxrregcount",
}
#: Prefixes of single-token flags we keep (``-Idir``, ``-DNAME=1``, ``-std=c++17``).
_KEEP_PREFIXES = (
    "-I", "-D", "-U", "-isystem", "-std=", "--std=", "-arch=", "--gpu-architecture=", "-gencode=",
    "--generate-code=", "--expt-", "-rdc", "--relocatable-device-code", "-maxrregcount=",
    "--maxrregcount=", "--use_fast_math", "-use_fast_math", "-ftz=", "-prec-div=", "-prec-sqrt=",
    "-fmad=", "--include-path=", "--define-macro=", "-G", "-Xcompiler", "--extended-lambda",
    "-ccbin=", "--compiler-bindir=",
)
#: Flags with a separate value that we drop together with the value.
_DROP_WITH_VALUE = {"-o", "--output-file", "-MF", "-MT", "-MQ", "--dependency-output", "-odir"}
#: Flags about our own output choice, dropped (we add -cubin and -Xptxas -v ourselves).
_DROP_SINGLE = {"-c", "--compile", "-cubin", "--cubin", "-ptx", "--ptx", "-M", "-MD", "-MMD", "-E", "-S"}


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
    """Loads databases lazily and caches them by (path, mtime, size)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[tuple[float, int], list[dict] | str]] = {}

    def flags_for(self, file_path: str, workspace_root: str | None) -> DbFlags:
        db = find_db(file_path, workspace_root)
        if db is None:
            return DbFlags(None, None)
        entries = self._load(db)
        if isinstance(entries, str):
            return DbFlags(str(db), None, problem=entries)
        target = os.path.realpath(file_path)
        for entry in entries:
            directory = str(entry.get("directory") or db.parent)
            name = entry.get("file")
            if not isinstance(name, str):
                continue
            if os.path.realpath(os.path.join(directory, name)) != target:
                continue
            argv = _entry_argv(entry)
            if argv is None:
                return DbFlags(str(db), None, directory, problem=f"{db}: entry for {name} has no 'arguments' or 'command'")
            return DbFlags(str(db), keep_flags(argv[1:], directory, target), directory)
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


def _parse_db(db: Path) -> list[dict] | str:
    try:
        data = json.loads(db.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError) as exc:
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
    """Filter a compile command's arguments (without argv[0]) down to the ones we reuse."""
    kept: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        value = args[i + 1] if i + 1 < len(args) else None
        if arg in _DROP_WITH_VALUE:
            i += 2
            continue
        if arg in _DROP_SINGLE or arg.startswith(("-o", "-MF", "-MT")) and arg not in _KEEP_WITH_VALUE:
            i += 1
            continue
        if not arg.startswith("-"):
            # A positional argument: the source file itself (or another input); we pass our own.
            i += 1
            continue
        if arg in _KEEP_WITH_VALUE and value is not None:
            if arg in ("-I", "-isystem", "--include-path", "--system-include", "-include", "--pre-include"):
                value = _absolute(value, directory)
            kept += [arg, value]
            i += 2
            continue
        if arg.startswith("-I") and len(arg) > 2:
            kept.append("-I" + _absolute(arg[2:], directory))
        elif arg.startswith("-isystem") and len(arg) > len("-isystem"):
            kept.append("-isystem" + _absolute(arg[len("-isystem"):], directory))
        elif arg.startswith(_KEEP_PREFIXES):
            kept.append(arg)
            if arg == "-Xcompiler" and value is not None:
                kept.append(value)
                i += 1
        i += 1
    return tuple(kept)
