"""Parse what nvcc prints: diagnostics and ``-Xptxas -v`` resource usage.

Formats handled (samples recorded from CUDA 13.0 under tests/fixtures/nvcc/):

* the CUDA front end (EDG): ``file.cu(12): error: ...`` and
  ``file.cu(4): warning #177-D: ...``, followed by the offending source line
  and a caret line that gives the column;
* the host compiler (gcc/clang): ``file.cu:1:10: fatal error: ...``;
* MSVC: ``file.cu(12): error C2065: ...`` and ``file.cu(12,5): ...``;
* tools without a source position: ``ptxas error   : ...``,
  ``nvcc fatal   : ...``, ``nvlink error   : ...``;
* ptxas resource lines: ``Compiling entry function '_Z..' for 'sm_90'``,
  ``Function properties for _Z..``, ``N bytes stack frame, N bytes spill
  stores, N bytes spill loads``, ``Used N registers, used N barriers, N bytes
  smem, N bytes cmem[0]`` (older releases omit barriers and add cmem).

Lines, as compilers print them, are 1-based; so are columns.

Reading is linear in the output and bounded: each line is matched on its first
:data:`MAX_LINE_CHARS` characters (EDG echoes the whole source line under every
message, 66 KB for a one-line file), and :func:`read_diagnostics` keeps the first
:data:`MAX_MESSAGES` messages and counts the rest.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from tree_sitter import Parser, Query, QueryCursor

from kernel_lsp.core.demangle import demangle
from kernel_lsp.core.parse import CUDA_LANGUAGE, parser_input

SEVERITIES = ("error", "warning", "info")

#: Characters of one output line that are read (a message's text, a path); the rest of a longer line is not.
MAX_LINE_CHARS = 4096
#: Diagnostics kept from one compile; the rest are counted (:attr:`Diagnostics.more`).
MAX_MESSAGES = 500


@dataclass(frozen=True)
class CompilerMessage:
    path: str | None
    """As printed by the compiler (relative or absolute); None for tool messages (ptxas, nvlink)."""
    line: int | None
    """1-based; None when the message has no source position."""
    column: int | None
    """1-based, from the caret line or ``file:line:col``; None when unknown."""
    severity: str
    """``error``, ``warning`` or ``info`` (notes and remarks)."""
    code: str | None
    """``177-D``, ``-Wunused-variable``, ``C2065``; None when the compiler gives none."""
    message: str
    """The message text; EDG context lines (``detected during instantiation ...``) follow after newlines."""
    tool: str = "nvcc"
    """``nvcc`` (front end), ``host`` (gcc/clang/MSVC), ``ptxas``, ``nvlink``."""
    mangled_name: str | None = None
    """For ptxas messages about one entry function (``Entry function '_Z3bigPf' uses too much shared data``)."""


@dataclass(frozen=True)
class ResourceUsage:
    mangled_name: str
    """As ptxas names the entry (``_Z5saxpyifPKfPf``, or ``plain_c`` for ``extern "C"``)."""
    arch: str
    """``sm_90``-style."""
    registers_per_thread: int | None
    spill_store_bytes: int | None
    spill_load_bytes: int | None
    stack_frame_bytes: int | None
    shared_bytes_static: int | None
    """Static ``__shared__`` bytes per block (dynamic shared memory is a launch parameter)."""
    constant_bytes: int | None
    """Sum of the ``cmem[N]`` banks ptxas lists for the entry (parameters and ``__constant__`` data);
    None when it lists none (CUDA 13 for sm_90 does not)."""
    barriers: int | None

    @property
    def base_name(self) -> str:
        """Source base name (``saxpy``), for matching the kernel index."""
        demangled = demangle(self.mangled_name)
        return demangled.base_name if demangled is not None else self.mangled_name

    @property
    def qualified_name(self) -> str:
        """``ns::kernel<float>``; the mangled name when it cannot be demangled."""
        demangled = demangle(self.mangled_name)
        return demangled.qualified_name if demangled is not None else self.mangled_name

    @property
    def has_spills(self) -> bool:
        return bool(self.spill_store_bytes) or bool(self.spill_load_bytes)


_SEVERITY = {
    "error": "error", "fatal error": "error", "catastrophic error": "error", "internal error": "error",
    "fatal": "error", "warning": "warning", "note": "info", "remark": "info", "info": "info",
}
_EDG = re.compile(
    r"^(?P<path>.+?)\((?P<line>\d+)(?:,\s*(?P<col>\d+))?\)\s*:\s*"
    r"(?P<sev>catastrophic error|internal error|fatal error|error|warning|remark|note)"
    r"(?:\s+#?(?P<code>[A-Za-z]*\d[\w-]*))?\s*:\s*(?P<msg>.*)$"
)
_GCC = re.compile(
    r"^(?P<path>(?:[A-Za-z]:)?[^:\n]+?):(?P<line>\d+):(?:(?P<col>\d+):)?\s*"
    r"(?P<sev>fatal error|error|warning|note|remark)\s*:\s*(?P<msg>.*?)(?:\s+\[(?P<code>-W[\w=-]+)\])?$"
)
_TOOL = re.compile(r"^(?P<tool>ptxas|nvcc|nvlink|fatbinary|cicc|cudafe\+\+)\s+(?P<sev>fatal|error|warning|info)\s*:\s*(?P<msg>.*)$")
_CARET = re.compile(r"^\s*\^[\s~^]*$")
_GCC_GUTTER = re.compile(r"^\s*\d*\s*\|")
_QUOTED_ENTRY = re.compile(r"(?:[Ee]ntry function|[Ff]unction)\s+'([^']+)'")
# EDG echoes the source line with two extra leading spaces before the caret line.
_EDG_ECHO_INDENT = 2


@dataclass(frozen=True)
class Diagnostics:
    messages: tuple[CompilerMessage, ...]
    """The first ``limit`` diagnostics, in order."""
    more: int = 0
    """Diagnostics after those (their header lines counted, not parsed)."""


def parse_diagnostics(text: str) -> tuple[CompilerMessage, ...]:
    """Every diagnostic in nvcc's combined stdout/stderr, in order. Never raises."""
    return read_diagnostics(text, None).messages


def _is_message(line: str) -> bool:
    """Whether ``line`` starts a diagnostic (as the loop below reads one), for counting those past the limit."""
    if _EDG.match(line) or _GCC.match(line):
        return True
    tool = _TOOL.match(line.strip())
    return tool is not None and tool.group("sev") != "info"


def read_diagnostics(text: str, limit: int | None = MAX_MESSAGES) -> Diagnostics:
    """The first ``limit`` diagnostics (None: all) of nvcc's combined stdout/stderr, and how many more
    there are. Linear in ``text``; never raises."""
    lines = text.splitlines()
    messages: list[CompilerMessage] = []
    more = 0
    i = 0
    while i < len(lines):
        line = lines[i][:MAX_LINE_CHARS].rstrip()
        if limit is not None and len(messages) >= limit:
            more += _is_message(line)
            i += 1
            continue
        m = _EDG.match(line)
        if m is not None and not _GCC.match(line):
            consumed, column, context = _edg_tail(lines, i + 1)
            col = int(m.group("col")) if m.group("col") else column
            tool = "host" if (m.group("code") or "").startswith("C") else "nvcc"
            msg = m.group("msg").strip() + "".join("\n" + c for c in context)
            messages.append(
                CompilerMessage(m.group("path").strip(), int(m.group("line")), col, _SEVERITY[m.group("sev")],
                                m.group("code"), msg, tool)
            )
            i += 1 + consumed
            continue
        m = _GCC.match(line)
        if m is not None:
            consumed = _gcc_tail(lines, i + 1)
            messages.append(
                CompilerMessage(m.group("path").strip(), int(m.group("line")),
                                int(m.group("col")) if m.group("col") else None, _SEVERITY[m.group("sev")],
                                m.group("code"), m.group("msg").strip(), "host")
            )
            i += 1 + consumed
            continue
        m = _TOOL.match(line.strip())
        if m is not None and m.group("sev") != "info":
            entry = _QUOTED_ENTRY.search(m.group("msg"))
            tool = m.group("tool") if m.group("tool") in ("ptxas", "nvlink") else "nvcc"
            messages.append(
                CompilerMessage(None, None, None, _SEVERITY[m.group("sev")], None, m.group("msg").strip(), tool,
                                entry.group(1) if entry else None)
            )
        i += 1
    return Diagnostics(tuple(messages), more)


def _edg_tail(lines: list[str], start: int) -> tuple[int, int | None, list[str]]:
    """Lines after an EDG header: (lines consumed, 1-based caret column, context lines)."""
    column = None
    context: list[str] = []
    i = start
    while i < len(lines):
        full = lines[i].rstrip()
        line = full[:MAX_LINE_CHARS]
        if not full.strip():
            i += 1
            break
        if _EDG.match(line) or _GCC.match(line) or _TOOL.match(line.strip()):
            break
        if _CARET.match(full):
            column = max(1, full.index("^") - _EDG_ECHO_INDENT + 1)
        elif i + 1 < len(lines) and _CARET.match(lines[i + 1].rstrip()):
            pass  # the echoed source line
        else:
            context.append(line.strip())
        i += 1
    return i - start, column, context


def _gcc_tail(lines: list[str], start: int) -> int:
    """gcc's source excerpt: ``    1 | code`` and ``      |   ^~~`` lines."""
    i = start
    while i < len(lines) and _GCC_GUTTER.match(lines[i]):
        i += 1
    return i - start


_ENTRY = re.compile(r"Compiling entry function '(?P<name>[^']+)' for '(?P<arch>[\w]+)'")
_PROPERTIES = re.compile(r"Function properties for (?P<name>\S+)")
_FRAME = re.compile(
    r"(?P<stack>\d+) bytes stack frame, (?P<stores>\d+) bytes spill stores, (?P<loads>\d+) bytes spill loads"
)
_USED = re.compile(r"Used (?P<regs>\d+) registers(?P<rest>.*)$")
_BARRIERS = re.compile(r"used (\d+) barriers")
_SMEM = re.compile(r"(\d+) bytes smem")
_CMEM = re.compile(r"(\d+) bytes cmem\[\d+\]")


def parse_resource_usage(text: str) -> tuple[ResourceUsage, ...]:
    """One record per entry function and architecture in ``-Xptxas -v`` output, in order.

    Non-entry ``__device__`` functions also get "Function properties" lines; they
    are not kernels and are skipped. Never raises.
    """
    records: dict[tuple[str, str], dict[str, int | None]] = {}
    current: tuple[str, str] | None = None
    properties_for: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        m = _ENTRY.search(line)
        if m is not None:
            current = (m.group("name"), m.group("arch"))
            records[current] = dict.fromkeys(
                ("registers_per_thread", "spill_store_bytes", "spill_load_bytes", "stack_frame_bytes",
                 "shared_bytes_static", "constant_bytes", "barriers")
            )
            properties_for = None
            continue
        m = _PROPERTIES.search(line)
        if m is not None:
            properties_for = m.group("name")
            continue
        m = _FRAME.search(line)
        if m is not None:
            if current is not None and properties_for == current[0]:
                record = records[current]
                record["stack_frame_bytes"] = int(m.group("stack"))
                record["spill_store_bytes"] = int(m.group("stores"))
                record["spill_load_bytes"] = int(m.group("loads"))
            continue
        m = _USED.search(line)
        if m is not None and current is not None and "ptxas" in raw:
            record = records[current]
            rest = m.group("rest")
            record["registers_per_thread"] = int(m.group("regs"))
            barriers = _BARRIERS.search(rest)
            record["barriers"] = int(barriers.group(1)) if barriers else None
            smem = _SMEM.search(rest)
            record["shared_bytes_static"] = int(smem.group(1)) if smem else 0
            cmem = [int(v) for v in _CMEM.findall(rest)]
            record["constant_bytes"] = sum(cmem) if cmem else None
    return tuple(ResourceUsage(name, arch, **fields) for (name, arch), fields in records.items())  # type: ignore[arg-type]


_INCLUDES = Query(CUDA_LANGUAGE, "(preproc_include path: (_) @path)")


@functools.lru_cache(maxsize=8)
def _include_names(source: str) -> tuple[tuple[int, str], ...]:
    """(0-based line, name as written) of every ``#include`` tree-sitter finds (none in comments; those in
    every ``#if`` arm, since the compile may take any); cached per text: one compile's messages about
    several headers ask with the same text."""
    data = source.encode("utf-8", errors="replace")
    captures = QueryCursor(_INCLUDES).captures(Parser(CUDA_LANGUAGE).parse(parser_input(data)).root_node)
    found = sorted((n.start_point[0], data[n.start_byte + 1 : n.end_byte - 1].decode("utf-8", "replace"))
                   for n in captures.get("path", ()))
    return tuple(found)


def include_line(source: str, header_path: str) -> int | None:
    """0-based line of the ``#include`` in ``source`` that names ``header_path``, or None.

    A compiler message about a header belongs where the document brings that
    header in. The directive matches when its name is the header path's tail
    (``"util/math.cuh"`` names ``/work/util/math.cuh``); the longest such name
    wins, then the first. Headers included by other headers are not found here.
    """
    parts = header_path.replace("\\", "/").split("/")
    best: tuple[int, int] | None = None
    for line, name in _include_names(source):
        named = name.replace("\\", "/").removeprefix("./").split("/")
        if len(named) <= len(parts) and parts[-len(named):] == named:
            if best is None or len(named) > best[0]:
                best = (len(named), line)
    return None if best is None else best[1]
