"""What may reach nvcc's command line: the one check for every value kernel-lsp passes to nvcc.

nvcc runs its host compiler (and ptxas) through ``/bin/sh``. It writes ``-D``/``-U`` values, the
``-I``/``-isystem`` folders, the input file and the ``-o`` name inside double quotes, where
`` ` `` ``$`` ``"`` ``\\`` still act (``-I`` values get ``$`` escaped, backticks not), and the values of
``-Xcompiler``/``-Xptxas`` and the other pass-through options without quotes at all (measured with
``nvcc -dryrun``, CUDA 13.0). So a value holding any of those characters, or a newline, runs a command
when a file is compiled, whichever source gave it: a compile database, a setting, initializationOptions,
a file or folder name. :func:`shell_problem` says why a value cannot go on the command line;
:func:`safe_flags` drops each such flag with its value and names why. The compiler service uses the same
check on the whole command line before nvcc starts.

``allowedCompilers`` patterns are matched by :func:`path_matches`, one path segment against one pattern
segment, so ``*`` never matches ``/`` and a ``..`` in the compiler's path cannot walk out of the folder the
pattern names (the caller matches the compiler's resolved real path).

Pure: strings in, strings out.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence

#: Characters that keep their meaning inside the double quotes nvcc writes around values.
SHELL_ACTIVE = {"`": "a backtick", "$": "'$'", '"': "a double quote", "\\": "a backslash", "\n": "a newline",
                "\r": "a carriage return", "\0": "a NUL byte"}

#: Options whose value nvcc passes to the host compiler, ptxas, nvlink, ... unquoted.
UNQUOTED_VALUE = frozenset(("-Xcompiler", "--compiler-options", "-Xptxas", "--ptxas-options", "-Xnvlink",
                            "--nvlink-options", "-Xlinker", "--linker-options", "-Xarchive", "--archive-options",
                            "-Xfatbin", "--fatbin-options"))
#: What an unquoted value may hold: words of options (``-O3,-fPIC``, ``--maxrregcount=32``), no shell syntax.
_PLAIN = re.compile(r"[A-Za-z0-9_.,=+:/@%^-]*")

#: nvcc options that take the next argument as their value when written bare (``-I dir``, ``-ccbin g++``).
TAKES_VALUE = frozenset((
    "-I", "--include-path", "-isystem", "--system-include", "-include", "--pre-include", "-D", "--define-macro",
    "-U", "--undefine-macro", "-std", "--std", "-arch", "--gpu-architecture", "-gencode", "--generate-code",
    "-code", "--gpu-code", "-maxrregcount", "--maxrregcount", "-rdc", "--relocatable-device-code", "-ftz", "--ftz",
    "-prec-div", "--prec-div", "-prec-sqrt", "--prec-sqrt", "-fmad", "--fmad", "-default-stream",
    "--default-stream", "-x", "--x", "-ccbin", "--compiler-bindir", "-o", "--output-file", "-MF", "-MT", "-MQ",
    "--dependency-output", "-odir", "--output-directory", "-l", "--library", "-L", "--library-path", "-ldir",
    "--libdevice-directory", "-keep-dir", "--keep-dir", "-run-args", "--run-args", "-time", "--time", "-t",
    "--threads", "-diag-suppress", "--diag-suppress", "-diag-warn", "--diag-warn", "-diag-error", "--diag-error",
    "-split-compile", "--split-compile", "-Werror", "--Werror", "-optf", "--options-file",
    *UNQUOTED_VALUE,
))


def shell_problem(value: str) -> str | None:
    """Why ``value`` cannot be written on nvcc's command line (the shell would act on it), or None."""
    for char, name in SHELL_ACTIVE.items():
        if char in value:
            return f"holds {name}, which the shell nvcc runs its host compiler through would act on"
    return None


def _unquoted_problem(value: str) -> str | None:
    if _PLAIN.fullmatch(value) is None:
        bad = next(c for c in value if _PLAIN.fullmatch(c) is None)
        return (f"holds {bad!r}: nvcc passes this option's value to a shell without quotes, so only letters, "
                "digits and _ . , = + : / @ % ^ - may appear")
    return None


def safe_flags(flags: Sequence[str]) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """(flags kept, (flag as written, why) for each dropped one): every flag whose text or value the shell
    would act on is dropped together with its value, so no value is left to be read as a flag."""
    kept: list[str] = []
    dropped: list[tuple[str, str]] = []
    i = 0
    while i < len(flags):
        flag = flags[i]
        name = flag.partition("=")[0]
        if flag in TAKES_VALUE and i + 1 < len(flags):
            value = flags[i + 1]
            group = [flag, value]
        else:
            value = flag.partition("=")[2] if "=" in flag else flag
            group = [flag]
        i += len(group)
        why = next(filter(None, map(shell_problem, group)), None)
        if why is None and (flag in UNQUOTED_VALUE or name in UNQUOTED_VALUE):
            why = _unquoted_problem(value)
        if why is None:
            kept += group
        else:
            dropped.append((" ".join(group), why))
    return tuple(kept), tuple(dropped)


def pattern_problem(pattern: str) -> str | None:
    """Why an ``allowedCompilers`` pattern cannot be used, or None: it must be an absolute path whose
    segments name no ``.`` or ``..`` (the compiler's real path never holds them, so such a pattern could only
    ever have matched a path that walks out of the folder it seems to name)."""
    if not pattern.startswith("/"):
        return "must be an absolute path (e.g. /usr/bin/g++-*)"
    if any(part in (".", "..") for part in pattern.split("/")):
        return "must not hold '.' or '..' segments"
    return shell_problem(pattern)


def path_matches(path: str, pattern: str) -> bool:
    """Whether the absolute ``path`` matches ``pattern`` segment by segment (``*`` and ``?`` stay within one
    segment, ``[...]`` too); a pattern with a :func:`pattern_problem` matches nothing."""
    if pattern_problem(pattern) is not None or not path.startswith("/"):
        return False
    parts, wanted = path.split("/"), pattern.split("/")
    return len(parts) == len(wanted) and all(fnmatch.fnmatchcase(p, w) for p, w in zip(parts, wanted))
