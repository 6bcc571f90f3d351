"""Text helpers the rewrite rules share: masking, bracket matching, read/write analysis, splicing.

Rules match patterns on the kernel body with comments and string literals
blanked out (same length, so offsets stay valid) and splice into the original
text. Everything here is conservative: when a helper cannot prove a fact
(a pointer is never written, a statement has a given shape) it says so and the
rule refuses.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kernel_lsp.core.index import Function
from kernel_lsp.core.parse import comment_and_literal_ranges

IDENT = r"[A-Za-z_]\w*"
_ASSIGN_AFTER = re.compile(r"\s*(=(?!=)|\+=|-=|\*=|/=|%=|&=|\|=|\^=|<<=|>>=|\+\+|--)")
_BEFORE_INCDEC = re.compile(r"(\+\+|--)\s*$")


_WRAP_HEAD, _WRAP_TAIL = b"void __kernel_lsp_body__() {", b"\n}"


def mask(text: str) -> str:
    """``text`` (statements, such as a body's inside) with comments and string/char literals replaced by
    spaces, newlines kept, the same length: where they are is what tree-sitter's lexer says, as for the index."""
    data = text.encode("utf-8")
    # Statements parse as a function body; outside one they would be error recovery.
    ranges = comment_and_literal_ranges(_WRAP_HEAD + data + _WRAP_TAIL)
    if not ranges:
        return text
    to_char = _char_offsets(text, data)
    out = list(text)
    for start, end in ranges:
        start, end = max(start - len(_WRAP_HEAD), 0), min(end - len(_WRAP_HEAD), len(data))
        for k in range(to_char(start), to_char(end)):
            if out[k] != "\n":
                out[k] = " "
    return "".join(out)


def _char_offsets(text: str, data: bytes) -> Callable[[int], int]:
    """Byte offset -> character offset in ``text`` (identity for ASCII)."""
    if len(data) == len(text):
        return lambda offset: offset
    starts = list(itertools.accumulate((len(ch.encode("utf-8")) for ch in text), initial=0))
    return lambda offset: bisect.bisect_left(starts, offset)


def match_close(text: str, open_at: int) -> int | None:
    """Index of the bracket closing the one at ``open_at`` (``(``, ``[`` or ``{``) in masked text."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    opening = text[open_at]
    closing = pairs[opening]
    depth = 0
    for i in range(open_at, len(text)):
        c = text[i]
        if c == opening:
            depth += 1
        elif c == closing:
            depth -= 1
            if depth == 0:
                return i
    return None


def squash(text: str) -> str:
    """Whitespace removed: for comparing expressions as written."""
    return re.sub(r"\s+", "", text)


@dataclass(frozen=True)
class Subscript:
    name: str
    start: int
    """Offset of the name."""
    end: int
    """Offset just past the closing ``]``."""
    index: str
    """The index expression as written."""


def subscripts(masked: str, name: str) -> list[Subscript]:
    """Every ``name[...]`` in masked text (outer accesses; nested ones appear separately)."""
    out = []
    for m in re.finditer(rf"(?<![\w.>]){re.escape(name)}\s*\[", masked):
        close = match_close(masked, m.end() - 1)
        if close is not None:
            out.append(Subscript(name, m.start(), close + 1, masked[m.end() : close]))
    return out


def occurrences(masked: str, name: str) -> list[int]:
    """Offsets of identifier ``name`` (not a member ``.name`` / ``->name``)."""
    return [m.start() for m in re.finditer(rf"(?<![\w.])(?<!->){re.escape(name)}\b", masked)]


def is_written_at(masked: str, sub: Subscript) -> bool:
    """True when ``name[i]`` at ``sub`` is assigned, incremented, or has its address taken."""
    if _ASSIGN_AFTER.match(masked, sub.end):
        return True
    before = masked[: sub.start].rstrip()
    return bool(_BEFORE_INCDEC.search(before)) or before.endswith("&")


def rewrite_subscripts(masked: str, text: str, names: Iterable[str], fn: Callable[[str, str], str]) -> str:
    """Replace every ``name[index]`` read with ``fn(name, rewritten_index)``, innermost first.

    ``masked`` and ``text`` are the same length (``masked = mask(text)``).
    """
    names = set(names)
    if not names:
        return text
    pattern = re.compile(r"(?<![\w.>])(" + "|".join(re.escape(n) for n in sorted(names)) + r")\s*\[")
    out: list[str] = []
    pos = 0
    while True:
        m = pattern.search(masked, pos)
        if m is None:
            out.append(text[pos:])
            return "".join(out)
        close = match_close(masked, m.end() - 1)
        if close is None:
            out.append(text[pos:])
            return "".join(out)
        inner_text = text[m.end() : close]
        inner = rewrite_subscripts(masked[m.end() : close], inner_text, names, fn)
        out.append(text[pos : m.start()])
        out.append(fn(m.group(1), inner))
        pos = close + 1


def body_text(source_bytes: bytes, fn: Function) -> tuple[int, int, str]:
    """(start byte, end byte, text) of the body's inside, without its braces."""
    assert fn.body_span is not None
    start, end = fn.body_span.start_byte + 1, fn.body_span.end_byte - 1
    return start, end, source_bytes[start:end].decode("utf-8")


def splice(source_bytes: bytes, start: int, end: int, new: str) -> str:
    """The source with bytes [start, end) replaced by ``new``, as text."""
    return (source_bytes[:start] + new.encode("utf-8") + source_bytes[end:]).decode("utf-8")


def line_start(source_bytes: bytes, at: int) -> int:
    return source_bytes.rfind(b"\n", 0, at) + 1


def indent_of(source_bytes: bytes, at: int) -> str:
    start = line_start(source_bytes, at)
    line = source_bytes[start:at].decode("utf-8")
    return line[: len(line) - len(line.lstrip())]


def split_statements(masked: str) -> list[tuple[int, int]]:
    """Top-level statements of a body as (start, end) offsets: ``;``-ended, or a braced/compound statement."""
    out = []
    i, n = 0, len(masked)
    while i < n:
        while i < n and masked[i].isspace():
            i += 1
        if i >= n:
            break
        start = i
        depth = 0
        while i < n:
            c = masked[i]
            if c in "([":
                depth += 1
            elif c in ")]":
                depth -= 1
            elif c == "{":
                close = match_close(masked, i)
                if close is None:
                    return out + [(start, n)]
                i = close
                if depth == 0:
                    # A compound statement ends at its brace unless an else follows.
                    rest = masked[i + 1 :].lstrip()
                    if not rest.startswith("else") and not rest.startswith(";"):
                        i += 1
                        break
            elif c == ";" and depth == 0:
                i += 1
                break
            i += 1
        out.append((start, i))
    return out


def block_inner(masked: str, text: str) -> tuple[str, str] | None:
    """The inside of ``{ ... }`` (masked, text) when the statement is one braced block; None otherwise."""
    s = masked.strip()
    if s.startswith("{") and match_close(s, 0) == len(s) - 1:
        offset = masked.index("{")
        end = offset + len(s) - 1
        return masked[offset + 1 : end], text[offset + 1 : end]
    return None


def statement_body(masked: str, text: str) -> tuple[str, str]:
    """A controlled statement's inside: the braces' content, or the single statement itself."""
    inner = block_inner(masked, text)
    return inner if inner is not None else (masked, text)


def global_index_pattern(axis: str = "x") -> str:
    """Regex for ``blockIdx.A * blockDim.A + threadIdx.A`` (either product order, optional casts and parentheses)."""
    cast = r"(?:\(\s*(?:long\s*long|unsigned(?:\s*int)?|int|size_t|long|int64_t)\s*\)\s*)?"
    bi, bd, ti = rf"blockIdx\.{axis}", rf"blockDim\.{axis}", rf"threadIdx\.{axis}"
    product = rf"\(?\s*{cast}(?:{bi}\s*\*\s*{cast}{bd}|{bd}\s*\*\s*{cast}{bi})\s*\)?"
    return rf"\(?\s*(?:{product}\s*\+\s*{cast}{ti}|{cast}{ti}\s*\+\s*{product})\s*\)?"


def index_declaration(masked: str, axis: str = "x") -> re.Match[str] | None:
    """``T name = <global index on axis>;``: group ``type``, ``name``."""
    return re.search(
        rf"(?P<type>(?:const\s+)?(?:unsigned\s+int|unsigned|long\s+long|int|size_t|long|int64_t))\s+(?P<name>{IDENT})\s*=\s*"
        rf"{global_index_pattern(axis)}\s*;",
        masked,
    )


def declared_type(masked: str, name: str) -> str | None:
    m = re.search(rf"(?P<type>(?:const\s+)?(?:unsigned\s+int|unsigned|long\s+long|double|float|int|size_t|long))\s+{re.escape(name)}\s*=", masked)
    return re.sub(r"\s+", " ", m.group("type")) if m else None
