"""The preprocessed view of a CUDA file: its own macros and local headers expanded.

Real kernels hide their bodies and sizes in macros (``#define BODY a[i] = b[i] + s*c[i];``
then ``BODY;``; ``BLOCK_SIZE`` in ``common.cuh``). Every layer that needs to know what a kernel
*means* (the access analysis, launch sizes, spec drafting, rules) reads this view, so a macro
body is seen as the statements it stands for.

What is expanded: ``#define``/``#undef`` and conditionals of the file and of the headers it
includes with ``#include "…"`` (searched beside the including file, then in ``include_dirs``).
System headers (``#include <…>``) and headers that cannot be read are passed through
unexpanded: their declarations are known by name. The device view is taken (``__CUDACC__`` and
``__CUDA_ARCH__`` are defined), as nvcc's device pass sees the file.

Pure: files are read only through the ``read_file`` callable passed in (the services layer
gives one that reads the disk or the editor's open buffers). The preprocessor is pcpp
(pure Python, C99); its ``#line`` markers give the map from every expanded line back to the
(file, line) the user wrote.

Bounded: macro replacement grows without limit on hostile input (``#define A1 A0 A0`` …
``#define A40 A39 A39`` is 2^40 tokens from one name, and pcpp spends ~50 µs and ~1 KB per token
it produces), so every run has a :class:`Budget`: the tokens replacement may produce, and a
``should_stop`` check the caller's clock answers (the core reads no clock). A run that spends
its budget is the raw text, unexpanded, with :attr:`Preprocessed.over_budget` saying why and where.
"""

from __future__ import annotations

import functools
import gc
import io
import posixpath
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pcpp

from kernel_lsp.core.parse import common_prefix, common_suffix

ReadFile = Callable[[str], "str | None"]
"""Returns a file's text, or None when it cannot be read (missing, outside the workspace, …)."""

DEVICE_DEFINES: Mapping[str, str] = {"__CUDACC__": "1", "__CUDA_ARCH__": "900", "__NVCC__": "1"}
_LINE_MARKER = re.compile(r'^#line (\d+)(?: "((?:[^"\\]|\\.)*)")?\s*$')
_MAX_INCLUDE_DEPTH = 32
#: Tokens macro replacement may produce in one run (nested replacements counted at every level): at
#: pcpp's ~1 KB a token, ~100 MB however they nest. The corpus's most macro-heavy file (SHOC's md5hash)
#: spends 9,136, a 15-token statement macro used 5,000 times ~75,000. The bound is also a stall: when a
#: run stops, its largest token lists are freed in one go with the GIL held (in one process, the other
#: thread waited up to 36-45 ms at 200,000 tokens, 24 ms at 100,000).
MAX_EXPANSION_TOKENS = 100_000
#: Expansion steps (a line, a directive's expression or a replacement list) between two checks of the
#: budget's clock and yield point: pcpp spends ~50 µs a token, so a check every few milliseconds.
_CHECK_EVERY = 32


@dataclass(frozen=True)
class Budget:
    """What one preprocessing run may spend."""

    tokens: int = MAX_EXPANSION_TOKENS
    """Tokens that macro replacement may produce (every level of a nested replacement counts)."""
    should_stop: Callable[[], bool] | None = None
    """Asked every :data:`_CHECK_EVERY` steps: True once the caller's time budget is spent."""
    give_way: Callable[[], None] | None = None
    """Called at the same steps: a yield point where the caller's other work may go first (the server's
    event loop, see :mod:`kernel_lsp.server.foreground`)."""


class _CollectorPause:
    """The cyclic garbage collector held off while any run expands macros, on whichever thread.

    A run makes up to :data:`MAX_EXPANSION_TOKENS` pcpp tokens (~1 KB each, freed by reference counting,
    no cycles), and the allocations set off full collections that scan all of them while holding the
    GIL: the server's event loop, on another thread, waited 112-144 ms in one go for a run on a
    2**40-token macro (``benchmarks/security_bounds.py --rows macros``). The collector is off from the
    first run's start to the last one's end, and only where it was on; a run's own frame (its expander
    and token lists) is gone before the collector is back, or the first collection after it would scan
    them instead (gen0 and gen1 collections of ~100 ms were seen when it came back one frame too early).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs = 0
        self._resume = False

    def __enter__(self) -> None:
        with self._lock:
            if self._runs == 0:
                self._resume = gc.isenabled()
                gc.disable()
            self._runs += 1

    def __exit__(self, *_exc: object) -> None:
        with self._lock:
            self._runs -= 1
            if self._runs == 0 and self._resume:
                gc.enable()


_COLLECTOR_PAUSE = _CollectorPause()


class OverBudget(Exception):
    """Raised inside pcpp when a run has spent its :class:`Budget`."""

    def __init__(self, why: str, at: tuple[str, int] | None) -> None:
        self.why = why
        self.at = at
        """(file, 0-based line) of the text being expanded when the budget ran out."""
        self.where = f"{at[0]}:{at[1] + 1}" if at is not None else "?"
        super().__init__(f"{self.where}: {why}")


@dataclass(frozen=True)
class Macro:
    name: str
    params: tuple[str, ...] | None
    """Parameter names of a function-like macro; None for an object-like one."""
    body: str


@dataclass(frozen=True)
class Preprocessed:
    """A file after expansion, with the way back to what the user wrote."""

    text: str
    """The expanded text; ``#line`` markers are blanked so lines stay one to one with ``origins``."""
    path: str
    """The main file's absolute path (``/<buffer>`` when it has none)."""
    origins: tuple[tuple[str, int] | None, ...]
    """Per expanded line (0-based): the (file, 0-based line) it came from; None for a blanked marker."""
    macros: Mapping[str, Macro] = field(default_factory=dict)
    """Macros defined at the end of the file (own and local headers'), predefined ones left out."""
    includes: tuple[str, ...] = ()
    """Local headers that were expanded, as resolved paths, in first-inclusion order."""
    passed_through: tuple[str, ...] = ()
    """``#include`` targets left unexpanded (system or unreadable headers), as written."""
    errors: tuple[str, ...] = ()
    """Preprocessor messages (``file:line: message``); expansion goes on past them."""
    over_budget: str | None = None
    """Set when expansion spent its :class:`Budget` (``file:line: why``): the view is then the raw text."""
    over_budget_at: tuple[str, int] | None = None
    """Where the expansion was when it spent its budget: (file, 0-based line of the preprocessed input)."""
    pcpp_macros: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """The macros as pcpp holds them (read only), for :func:`expand_snippet` to start from."""

    def origin(self, line: int) -> tuple[str, int] | None:
        """Where expanded line ``line`` (0-based) came from, or None."""
        return self.origins[line] if 0 <= line < len(self.origins) else None

    def user_line(self, line: int) -> int | None:
        """The main file's 0-based line for expanded ``line``; None when it came from a header."""
        found = self.origin(line)
        return found[1] if found is not None and found[0] == self.path else None

    def object_macros(self) -> dict[str, str]:
        """Object-like macros as name -> replacement text (the form launch sizes and specs read)."""
        return {m.name: m.body for m in self.macros.values() if m.params is None}

    @functools.cached_property
    def code_macros(self) -> frozenset[str]:
        """Names of the macros whose replacement holds code, not just a value: a statement, a block, a
        declaration or definition (``;`` ``{`` ``}``, a CUDA qualifier, a keyword that starts one), a
        kernel launch, or a use of such a macro. Where one is used, the text tree-sitter reads is not what nvcc compiles."""
        bodies = {name: [t.value for t in m.value] for name, m in self.pcpp_macros.items() if name in self.macros}
        # A launch's chevrons are code too (pcpp lexes them as ``<<`` ``<``).
        code = {name for name, values in bodies.items()
                if _CODE_TOKENS.intersection(values) or "<<<" in "".join(values)}
        # A macro that uses one holds code too (``#define KERNEL GLOBAL void``), to a fixed point.
        grew = True
        while grew:
            more = {name for name, values in bodies.items() if name not in code and code.intersection(values)}
            code |= more
            grew = bool(more)
        return frozenset(code)


#: Tokens that make a macro's replacement code rather than a value (see :attr:`Preprocessed.code_macros`).
_CODE_TOKENS = frozenset({
    ";", "{", "}", "__global__", "__device__", "__host__", "__shared__", "__constant__", "__managed__",
    "__forceinline__", "__noinline__", "__launch_bounds__", "template", "typedef", "struct", "class", "union",
    "namespace", "extern", "static", "inline", "for", "while", "do", "if", "else", "switch", "case", "return",
    "goto", "break", "continue", "asm",
})


class _Expander(pcpp.Preprocessor):
    def __init__(self, read_file: ReadFile, budget: Budget | None = None) -> None:
        super().__init__()
        self._read_file = read_file
        self._budget = budget or Budget()
        self._spent = 0
        self._steps = 0
        self._depth = 0
        """Nesting of :meth:`expand_macros` calls (0: a line of the input, or a directive's expression)."""
        self._at: Any = None
        """The first token of the input being expanded at depth 0."""
        self.messages: list[str] = []
        self.expanded: list[str] = []
        self.passed: list[str] = []
        self.line_directive = "#line"
        self.compress = 0
        # pcpp rewrites marker paths relative to the process's working directory; the map needs
        # them as resolved, so the main file and each header are recognised by their own names.
        self.rewrite_paths = []

    def add_path(self, path: str) -> None:
        self.path.append(path)

    def expand_macros(self, tokens, expanding_from=[]):  # noqa: ANN001, B006 (pcpp's signature)
        # pcpp calls itself here for every replacement list (``expanding_from`` names the macros being
        # replaced), so this sees every token replacement produces, at every level of nesting.
        if self._depth == 0:
            self._at = next((t for t in tokens if getattr(t, "source", None)), self._at)
        elif expanding_from:
            self._spent += len(tokens)
            if self._spent > self._budget.tokens:
                raise OverBudget(f"macro expansion over {self._budget.tokens:,} tokens (expanding {expanding_from[0]})",
                                 self._where())
        self._steps += 1
        if self._steps % _CHECK_EVERY == 0:
            budget = self._budget
            if budget.give_way is not None:
                budget.give_way()
            if budget.should_stop is not None and budget.should_stop():
                what = f" (expanding {expanding_from[0]})" if expanding_from else ""
                raise OverBudget(f"macro expansion over its time budget{what}", self._where())
        self._depth += 1
        try:
            return super().expand_macros(tokens, expanding_from)
        finally:
            self._depth -= 1

    def _where(self) -> tuple[str, int] | None:
        """(file, 0-based line) where the text being expanded was written (the use, not the macro's definition)."""
        at = self._at
        return (at.source, at.lineno - 1) if at is not None and at.lineno else None

    def on_error(self, file: str, line: int, msg: str) -> None:
        self.messages.append(f"{file}:{line}: {msg}")
        self.return_code += 1

    def on_file_open(self, is_system_include: bool, includepath: str) -> io.StringIO:
        if is_system_include or self.include_depth > _MAX_INCLUDE_DEPTH:
            raise OSError(includepath)
        text = self._read_file(includepath)
        if text is None:
            raise OSError(includepath)
        if includepath not in self.expanded:
            self.expanded.append(includepath)
        return io.StringIO(blank_comments(text[1:] if text.startswith("\ufeff") else text))

    def on_include_not_found(self, is_malformed, is_system_include, curdir, includepath):  # noqa: ANN001
        self.passed.append(includepath)
        raise pcpp.OutputDirective(pcpp.Action.IgnoreAndPassThrough)

    def on_directive_unknown(self, directive, toks, ifpassthru, precedingtoks):  # noqa: ANN001
        if directive.value in ("error", "warning"):
            text = "".join(tok.value for tok in toks).strip()
            self.messages.append(f"{directive.source}:{directive.lineno}: #{directive.value} {text}")
            return True
        return None



def blank_comments(text: str) -> str:
    """``text`` with every comment replaced by spaces, newlines kept.

    Done before pcpp sees the text: pcpp folds a multi-line comment into one space (every later
    line would then map to the wrong user line) and keeps a comment that ends a ``#define``
    in the macro's body (``#define H 16 // rows`` would comment out the rest of each line that
    uses ``H``). String and character literals are left alone.
    """
    out: list[str] = []
    i, n = 0, len(text)
    start = 0
    while i < n:
        c = text[i]
        if c == "/" and i + 1 < n and text[i + 1] in "/*":
            out.append(text[start:i])
            if text[i + 1] == "/":
                j = text.find("\n", i)
                j = n if j < 0 else j
                # A line comment ending in a backslash continues on the next line.
                while j < n and j > 0 and text[j - 1] == "\\":
                    nxt = text.find("\n", j + 1)
                    j = n if nxt < 0 else nxt
            else:
                j = text.find("*/", i + 2)
                j = n if j < 0 else j + 2
            out.append("".join("\n" if ch == "\n" else " " for ch in text[i:j]))
            i = start = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            i = min(j + 1, n)
        else:
            i += 1
    out.append(text[start:])
    return "".join(out)


def directive_lines(source: bytes, comments: Sequence[tuple[int, int]]) -> tuple[str, ...]:
    """The preprocessor directive lines of ``source`` in order, the lines that continue them included,
    with the ``comments`` (byte ranges, as tree-sitter lexes them) blanked.

    The macro table at the end of a file depends on these alone, so they preprocess to the same
    table in a fraction of the time, and they are the key under which a macro view is reused while
    only code lines change (typing a new line between two directives included).
    """
    return tuple(line.decode("utf-8", errors="replace") for _, line in _directive_lines(source, comments))


def directive_line_numbers(source: bytes, comments: Sequence[tuple[int, int]]) -> tuple[int, ...]:
    """The 0-based line of ``source`` of each of :func:`directive_lines`, in the same order."""
    return tuple(number for number, _ in _directive_lines(source, comments))


def _directive_lines(source: bytes, comments: Sequence[tuple[int, int]]) -> list[tuple[int, bytes]]:
    if b"#" not in source:
        return []
    pieces: list[bytes] = []
    pos = 0
    for start, end in comments:
        # A comment becomes spaces with its newlines kept: a directive's line ends where it did.
        pieces += [source[pos:start], b"\n".join(b" " * len(part) for part in source[start:end].split(b"\n"))]
        pos = end
    pieces.append(source[pos:])
    out: list[tuple[int, bytes]] = []
    continued = False
    for number, line in enumerate(b"".join(pieces).split(b"\n")):
        if continued or line.lstrip().startswith(b"#"):
            out.append((number, line))
            continued = line.rstrip().endswith(b"\\")
    return out


#: What an edit must touch to change which lines are directives or what they say: a ``#``, a
#: continuation backslash, a comment's delimiters (a ``/*`` can hide a directive, a ``*/`` reveal one),
#: a quote (a raw string can span lines).
_DIRECTIVE_BYTES = (b"#", b"\\", b"/*", b"*/", b'"')


def same_directives(old: bytes, new: bytes, prefix: int | None = None) -> bool:
    """True when ``new`` has the directive lines of ``old``: the lines the edits between them touched,
    and the line before those (a backslash there continues it), hold none of :data:`_DIRECTIVE_BYTES`
    in either text. Conservative: False may come for edits that changed no directive, True only when
    none changed. ``prefix``: the length of their common prefix, when the caller has it.
    """
    if old is new:
        return True
    if prefix is None:
        prefix = common_prefix(old, new)
    suffix = common_suffix(old, new, min(len(old), len(new)) - prefix)
    first = old.rfind(b"\n", 0, prefix) + 1
    start = old.rfind(b"\n", 0, max(first - 1, 0)) + 1
    for text in (old, new):
        stop = text.find(b"\n", len(text) - suffix)
        region = text[start : len(text) if stop < 0 else stop]
        if any(marker in region for marker in _DIRECTIVE_BYTES):
            return False
    return True


def _predefined_names(defines: Mapping[str, str]) -> frozenset[str]:
    return frozenset(defines) | {"__DATE__", "__TIME__", "__FILE__", "__LINE__", "__PCPP__", "__COUNTER__"}


def preprocess(
    text: str,
    path: str | None = None,
    read_file: ReadFile | None = None,
    include_dirs: tuple[str, ...] = (),
    defines: Mapping[str, str] | None = None,
    budget: Budget | None = None,
) -> Preprocessed:
    """Expand ``text`` (the main file, at ``path``) with its own macros and local headers.

    ``path`` should be absolute (a relative one is taken from ``/``; None names the text
    ``/<buffer>`` with no folder to search). ``defines`` are command-line macros (``-D``), added
    to the device-side predefined ones. ``budget``: what the run may spend (default: :class:`Budget`'s).
    Never raises on bad input: malformed directives become ``errors`` and expansion goes on; a run
    over its budget gives the raw text with :attr:`~Preprocessed.over_budget` set.
    """
    with _COLLECTOR_PAUSE:
        return _preprocess(text, path, read_file, include_dirs, defines, budget)


def _preprocess(text: str, path: str | None, read_file: ReadFile | None, include_dirs: tuple[str, ...],
                defines: Mapping[str, str] | None, budget: Budget | None) -> Preprocessed:
    # pcpp names the main file by its absolute path in its markers: give it one, so the map can
    # tell the main file's lines from a header's without asking for the working directory.
    main = path if path and posixpath.isabs(path) else posixpath.join("/", path or "<buffer>")
    expander = _Expander(read_file or (lambda _p: None), budget)
    predefined = {**DEVICE_DEFINES, **(defines or {})}
    for name, value in predefined.items():
        expander.define(f"{name} {value}")
    base = posixpath.dirname(main) if path else ""
    for folder in ((base,) if base else ()) + tuple(include_dirs):
        expander.add_path(folder)
    out = io.StringIO()
    try:
        expander.parse(blank_comments(text), main)
        expander.write(out)
    except OverBudget as exc:
        message = f"{exc.where}: {exc.why}: the file is read unexpanded"
        return _raw_view(text, main, (*expander.messages, message), over_budget=message, at=exc.at)
    except Exception as exc:  # pcpp raises on some malformed input; the view then is the raw text
        expander.messages.append(f"{main}:0: preprocessing stopped: {type(exc).__name__}: {exc}")
        return _raw_view(text, main, tuple(expander.messages))
    lines, origins = _strip_markers(out.getvalue(), main)
    skip = _predefined_names(predefined)
    macros = {
        name: Macro(name, tuple(m.arglist) if m.arglist is not None else None, "".join(t.value for t in m.value).strip())
        for name, m in expander.macros.items()
        if name not in skip
    }
    return Preprocessed(
        text="\n".join(lines),
        path=main,
        origins=tuple(origins),
        macros=macros,
        includes=tuple(expander.expanded),
        passed_through=tuple(dict.fromkeys(expander.passed)),
        errors=tuple(expander.messages),
        pcpp_macros=dict(expander.macros),
    )


def expand_snippet(view: Preprocessed, text: str, budget: Budget | None = None) -> Preprocessed:
    """``text``, a piece of ``view``'s main file (its lines from the piece's first), expanded with the
    macros ``view`` ends with (command-line ones included): what a unit of the file that uses macros
    stands for. Its ``origins`` are 0-based lines of ``text``. Nothing is read: an ``#include`` in the
    piece is passed through. Over ``budget``, the piece itself with :attr:`~Preprocessed.over_budget` set.
    """
    with _COLLECTOR_PAUSE:
        return _expand_snippet(view, text, budget)


def _expand_snippet(view: Preprocessed, text: str, budget: Budget | None) -> Preprocessed:
    expander = _Expander(lambda _p: None, budget)
    expander.macros.update(view.pcpp_macros)
    out = io.StringIO()
    try:
        expander.parse(blank_comments(text), view.path)
        expander.write(out)
    except OverBudget as exc:
        return _raw_view(text, view.path, (*expander.messages, str(exc)), over_budget=exc.why, at=exc.at)
    except Exception as exc:  # malformed input pcpp cannot take: the piece stays as written
        return _raw_view(text, view.path, (*expander.messages, f"expansion stopped: {type(exc).__name__}: {exc}"))
    lines, origins = _strip_markers(out.getvalue(), view.path)
    return Preprocessed(text="\n".join(lines), path=view.path, origins=tuple(origins), errors=tuple(expander.messages))


def _raw_view(text: str, main: str, errors: tuple[str, ...], over_budget: str | None = None,
              at: tuple[str, int] | None = None) -> Preprocessed:
    """The view of ``text`` unexpanded: every line its own origin, no macros."""
    return Preprocessed(text=text, path=main, origins=tuple((main, i) for i in range(text.count("\n") + 1)),
                        errors=errors, over_budget=over_budget, over_budget_at=at)


def _strip_markers(expanded: str, main: str) -> tuple[list[str], list[tuple[str, int] | None]]:
    lines = expanded.split("\n")
    origins: list[tuple[str, int] | None] = []
    current_file, current_line = main, 0
    for i, line in enumerate(lines):
        marker = _LINE_MARKER.match(line) if line.startswith("#line") else None
        if marker:
            current_line = int(marker.group(1)) - 1
            if marker.group(2) is not None:
                current_file = marker.group(2).replace('\\"', '"').replace("\\\\", "\\")
            lines[i] = ""
            origins.append(None)
            continue
        origins.append((current_file, current_line))
        current_line += 1
    return lines, origins
