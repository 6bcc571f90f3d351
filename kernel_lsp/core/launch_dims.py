"""Evaluate a launch's grid, block and shared-memory expressions when they are constants.

``k<<<grid, block, smem>>>(...)``: the block size decides occupancy, so we
resolve it when it is a literal (``256``), a ``dim3`` literal (``dim3(16, 16)``),
a file constant (``const int``/``constexpr int``), a macro of the file or of a
local header it includes (``BLOCK_SIZE`` in ``common.cuh``: the preprocessed
view's macro table, :mod:`kernel_lsp.core.source`), or a local declared earlier
in the enclosing function (``dim3 block(32, 8);``, ``int threads = 256;``,
``const int M = 512, N = 384;``), as :mod:`kernel_lsp.core.host_code` reads them
from the tree. A local that is assigned again before the launch (``threads = n;``,
``block.x = 64;``) is unknown: the answer is None rather than a guess. Pure:
source text, index and preprocessed view in, ints out.
"""

from __future__ import annotations

import functools
import re
import weakref
from collections.abc import Mapping
from dataclasses import dataclass

from kernel_lsp.core.consteval import evaluate_int
from kernel_lsp.core.host_code import host_scope
from kernel_lsp.core.index import KernelIndex, LaunchSite
from kernel_lsp.core.source import Preprocessed

Dims = tuple[int, int, int]

_DIM3_CALL = re.compile(r"^\s*(?:dim3\s*)?[({](?P<args>.*)[)}]\s*$", re.S)
#: Words of a declared type whose locals can hold a launch size (integers, or ``auto``).
_INTEGER_WORDS = frozenset({
    "const", "constexpr", "static", "register", "unsigned", "signed", "int", "long", "short", "size_t", "auto",
    "int32_t", "uint32_t", "int64_t", "uint64_t",
})


def _split_args(text: str) -> list[str]:
    """Split on top-level commas."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def file_constants(index: KernelIndex, pre: Preprocessed | None) -> dict[str, str]:
    """File-scope constants, with the preprocessed view's macros (local headers' included) over the index's own.

    A fresh dict each call (callers add their locals); the table itself is built once per (index, view):
    hover, code lens and inlay hints ask for every launch of a file with the same pair.
    """
    last = _LAST_TABLE[0]
    if last is not None and last[0]() is index and last[1] is pre:
        return dict(last[2])
    constants = dict(index.constants)
    if pre is not None:
        constants.update(pre.object_macros())
    # The index is held weakly: the last reference to a replaced index would otherwise be this table's,
    # and the next launch evaluated (a hover, on the event loop) would pay for freeing it.
    _LAST_TABLE[0] = (weakref.ref(index), pre, constants)
    return dict(constants)


_LAST_TABLE: list[tuple[weakref.ref[KernelIndex], Preprocessed | None, dict[str, str]] | None] = [None]


class _Scope:
    """File constants plus the locals of the enclosing function that are visible at the launch."""

    def __init__(self, launch: LaunchSite, source: bytes, constants: dict[str, str]) -> None:
        self.constants = constants
        self.dim3: dict[str, list[str]] = {}
        scope = host_scope(source, launch)
        for name, value in scope.defines:
            self.constants[name] = value
        for local in scope.locals:
            # A later declaration of the name shadows an earlier one, whatever its kind.
            self.constants.pop(local.name, None)
            self.dim3.pop(local.name, None)
            if scope.reassigned(local):
                continue
            if local.type_text.split()[-1] == "dim3":
                self.dim3[local.name] = list(local.args) if local.args is not None else [local.value or "1"]
            elif set(local.type_text.split()) <= _INTEGER_WORDS:
                value = local.value if local.value is not None else (local.args[0] if local.args and len(local.args) == 1 else None)
                if value is not None:
                    self.constants[local.name] = value

    def value(self, text: str) -> int | None:
        return evaluate_int(text, self.constants)

    def dims(self, text: str) -> Dims | None:
        text = text.strip()
        if not text:
            return None
        if text in self.dim3:
            return self._components(self.dim3[text])
        call = _DIM3_CALL.match(text)
        if call is not None and (text.startswith("dim3") or text.startswith("{")):
            return self._components(_split_args(call.group("args")))
        scalar = self.value(text)
        return (scalar, 1, 1) if scalar is not None else None

    def _components(self, args: list[str]) -> Dims | None:
        if not 1 <= len(args) <= 3 or args == [""]:
            return None
        values = [self.value(a) for a in args]
        if any(v is None for v in values):
            return None
        padded = [*values, 1, 1][:3]
        return padded[0], padded[1], padded[2]  # type: ignore[return-value]


def _source_bytes(source: str | bytes) -> bytes:
    return source if isinstance(source, bytes) else source.encode("utf-8", errors="replace")


@functools.lru_cache(maxsize=4)
def _defaulted(data: bytes, names: frozenset[str]) -> frozenset[str]:
    """The ``names`` that ``data`` defines only as defaults a command-line ``-D`` replaces.

    Cached: every launch of a document asks with the same text and macros, and the
    text is read once per document version instead of once per launch.
    """
    text = data.decode("utf-8", errors="replace")
    return frozenset(
        name for name in names
        if re.search(rf"#[ \t]*if(?:ndef[ \t]+{name}\b|[ \t]+!\s*defined\s*\(?\s*{name}\b)", text)
    )


def block_dims(launch: LaunchSite, source: str | bytes, index: KernelIndex, constants: Mapping[str, str] | None = None,
               pre: Preprocessed | None = None) -> Dims | None:
    """(x, y, z) threads per block, or None when not a visible constant.

    ``constants`` adds name -> expression bindings (e.g. from ``-D`` flags) under the file's own.
    """
    return evaluate_launch(launch, source, index, constants, pre).block


def block_threads(launch: LaunchSite, source: str | bytes, index: KernelIndex, constants: Mapping[str, str] | None = None,
                  pre: Preprocessed | None = None) -> int | None:
    """Threads per block (x*y*z) of a launch, or None when unknown."""
    return evaluate_launch(launch, source, index, constants, pre).block_threads


@dataclass(frozen=True)
class LaunchDims:
    """What is statically known about one launch's configuration; None fields are unknown."""

    grid: Dims | None
    block: Dims | None
    block_threads: int | None
    grid_blocks: int | None
    dynamic_shared_bytes: int | None
    """0 when the launch passes no shared-memory argument."""


def defines_from_flags(argv: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``-D NAME[=VALUE]`` / ``-DNAME[=VALUE]`` / ``--define-macro`` bindings of a compiler command line.

    A bare ``-DNAME`` means 1, as in the compiler; a later ``-U NAME`` removes it.
    """
    out: dict[str, str] = {}
    items = list(argv)
    i = 0
    while i < len(items):
        flag = items[i]
        i += 1
        kind = _MACRO_FLAGS.get(flag)
        if kind is not None:  # the value is the next argument
            if i >= len(items):
                break
            value = items[i]
            i += 1
        else:
            prefix = next((p for p in _MACRO_PREFIXES if flag.startswith(p) and len(flag) > len(p)), None)
            if prefix is None:
                continue
            kind, value = _MACRO_PREFIXES[prefix], flag[len(prefix):]
        name, eq, body = value.partition("=")
        if not _MACRO_NAME.fullmatch(name):
            continue
        if kind == "U":
            out.pop(name, None)
        else:
            out[name] = body if eq else "1"
    return out


_MACRO_FLAGS = {"-D": "D", "-U": "U", "--define-macro": "D", "--undefine-macro": "U"}
_MACRO_PREFIXES = {"--define-macro=": "D", "--undefine-macro=": "U", "-D": "D", "-U": "U"}
_MACRO_NAME = re.compile(r"[A-Za-z_]\w*")


def evaluate_launch(
    launch: LaunchSite, source: str | bytes, index: KernelIndex, constants: Mapping[str, str] | None = None,
    pre: Preprocessed | None = None,
) -> LaunchDims:
    """Grid, block and dynamic shared memory of a launch in one pass over the enclosing function.

    ``pre`` is the file's preprocessed view, expanded under ``constants`` (its macro
    table names the sizes that local headers define). ``constants`` (e.g. ``-D``
    flags) bind names under the file's own definitions, except a name the file only
    defaults (``#ifndef NAME`` or ``#if !defined(NAME)``): there the command line
    wins, as it does in the compiler. Without ``pre`` such guards are looked for in
    the file's own text.
    """
    data = _source_bytes(source)
    known = file_constants(index, pre)
    if constants and pre is not None:
        # The view was expanded under these -D macros: a name it does not define was only defaulted
        # (``#ifndef NAME``) where the index saw a ``#define``, and the command line wins.
        macros = pre.object_macros()
        known = {**constants, **{k: v for k, v in known.items() if k not in constants or k in macros}}
    elif constants:
        defaults = _defaulted(data, frozenset(constants))
        known = {**constants, **{k: v for k, v in known.items() if k not in defaults}}
    scope = _Scope(launch, data, known)
    grid = scope.dims(launch.grid)
    block = scope.dims(launch.block)
    grid = grid if grid is not None and all(d > 0 for d in grid) else None
    block = block if block is not None and all(d > 0 for d in block) else None
    if launch.shared_mem is None:
        smem: int | None = 0
    else:
        smem = scope.value(launch.shared_mem)
        smem = smem if smem is not None and smem >= 0 else None
    return LaunchDims(
        grid=grid,
        block=block,
        block_threads=block[0] * block[1] * block[2] if block is not None else None,
        grid_blocks=grid[0] * grid[1] * grid[2] if grid is not None else None,
        dynamic_shared_bytes=smem,
    )
