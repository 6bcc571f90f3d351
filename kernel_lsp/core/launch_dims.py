"""Evaluate a launch's grid, block and shared-memory expressions when they are constants.

``k<<<grid, block, smem>>>(...)``: the block size decides occupancy, so we
resolve it when it is a literal (``256``), a ``dim3`` literal (``dim3(16, 16)``),
a file constant (``#define BLOCK 256``, ``const int``/``constexpr int``), or a
local declared earlier in the enclosing function (``dim3 block(32, 8);``,
``int threads = 256;``, ``const int T = 2 * WARP;``). A local that is assigned
again before the launch (``threads = n;``, ``block.x = 64;``) is unknown: the
answer is None rather than a guess. Pure: source text and index in, ints out.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass

from kernel_lsp.core.consteval import evaluate_int
from kernel_lsp.core.index import KernelIndex, LaunchSite

Dims = tuple[int, int, int]

_COMMENTS = re.compile(rb"//[^\n]*|/\*.*?(?:\*/|\Z)", re.S)
_DIM3_DECL = re.compile(
    r"\bdim3\s+(?P<name>[A-Za-z_]\w*)\s*(?:\((?P<paren>[^;]*)\)|\{(?P<brace>[^;]*)\}|=\s*(?P<init>[^;]+))\s*;"
)
_SCALAR_DECL = re.compile(
    r"\b(?:(?:const|constexpr|static|register)\s+)*"
    r"(?:unsigned\s+int|unsigned\s+long|unsigned|int|long\s+long|long|short|size_t|u?int(?:32|64)_t|auto)\s+"
    r"(?P<name>[A-Za-z_]\w*)\s*(?:=\s*(?P<init>[^;,{]+)|\{(?P<brace>[^;}]*)\})\s*[;,]"
)
_LOCAL_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(?P<name>[A-Za-z_]\w*)[ \t]+(?P<value>[^\n]+)$", re.M)
_DIM3_CALL = re.compile(r"^\s*(?:dim3\s*)?[({](?P<args>.*)[)}]\s*$", re.S)


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


class _Scope:
    """File constants plus the locals of the enclosing function that are visible at the launch."""

    def __init__(self, launch: LaunchSite, source: bytes, index: KernelIndex) -> None:
        self.constants: dict[str, str] = dict(index.constants)
        self.dim3: dict[str, list[str]] = {}
        span = launch.enclosing_span
        if span is None:
            return
        region = _COMMENTS.sub(b" ", source[span.start_byte : launch.span.start_byte]).decode("utf-8", "replace")
        for m in _LOCAL_DEFINE.finditer(region):
            self.constants[m.group("name")] = m.group("value").strip()
        declared: dict[str, int] = {}
        for m in _SCALAR_DECL.finditer(region):
            init = m.group("init") if m.group("init") is not None else m.group("brace")
            self.constants[m.group("name")] = init.strip()
            self.dim3.pop(m.group("name"), None)
            declared[m.group("name")] = m.end()
        for m in _DIM3_DECL.finditer(region):
            name = m.group("name")
            if m.group("init") is not None:
                init = m.group("init").strip()
                call = _DIM3_CALL.match(init)
                args = _split_args(call.group("args")) if call else [init]
            else:
                args = _split_args(m.group("paren") if m.group("paren") is not None else m.group("brace"))
            if declared.get(name, -1) > m.end():
                continue  # a later scalar declaration shadows this one
            self.dim3[name] = args
            self.constants.pop(name, None)
            declared[name] = m.end()
        # Locals reassigned after their declaration are not constants at the launch.
        for name, end in declared.items():
            if re.search(rf"(?<![\w.]){re.escape(name)}\s*(?:\.\s*[xyz]\s*)?(?:[-+*/%&|^]|<<|>>)?=(?!=)", region[end:]):
                self.constants.pop(name, None)
                self.dim3.pop(name, None)
            elif re.search(rf"(?<![\w.]){re.escape(name)}\s*(?:\+\+|--)|(?:\+\+|--)\s*{re.escape(name)}\b", region[end:]):
                self.constants.pop(name, None)

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


def block_dims(launch: LaunchSite, source: str | bytes, index: KernelIndex, constants: Mapping[str, str] | None = None) -> Dims | None:
    """(x, y, z) threads per block, or None when not a visible constant.

    ``constants`` adds name -> expression bindings (e.g. from ``-D`` flags) under the file's own.
    """
    return evaluate_launch(launch, source, index, constants).block


def block_threads(launch: LaunchSite, source: str | bytes, index: KernelIndex, constants: Mapping[str, str] | None = None) -> int | None:
    """Threads per block (x*y*z) of a launch, or None when unknown."""
    return evaluate_launch(launch, source, index, constants).block_threads


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
    launch: LaunchSite, source: str | bytes, index: KernelIndex, constants: Mapping[str, str] | None = None
) -> LaunchDims:
    """Grid, block and dynamic shared memory of a launch in one pass over the enclosing function.

    ``constants`` (e.g. ``-D`` flags) bind names under the file's own definitions,
    except a name the file only defaults (``#ifndef NAME`` or ``#if !defined(NAME)``):
    there the command line wins, as it does in the compiler.
    """
    data = _source_bytes(source)
    scope = _Scope(launch, data, index)
    if constants:
        defaults = _defaulted(data, frozenset(constants))
        scope.constants = {**constants, **{k: v for k, v in scope.constants.items() if k not in defaults}}
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
