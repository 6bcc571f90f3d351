"""Text helpers the rewrite rules share: masking, subscripts and uses, splicing, statement shapes.

Rules match patterns on the kernel body with comments and string literals
blanked out (same length, so offsets stay valid) and splice into the original
text. Where a comment or literal is, which ``p[i]`` accesses and uses of a name
a fragment holds and whether an element is stored to, come from tree-sitter's
parse of the fragment (the parser the kernel index uses), not from a scanner of
their own. Everything here is conservative: when a helper cannot prove a fact
(a statement has a given shape) it says so and the rule refuses.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tree_sitter import Node, Parser

from kernel_lsp.core.index import Function
from kernel_lsp.core.parse import CUDA_LANGUAGE, comment_and_literal_ranges

IDENT = r"[A-Za-z_]\w*"


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
    written: bool = False
    """The element is assigned (``=``, ``+=``, also through a member or a further subscript), incremented,
    or has its address taken (``&p[i]``, as atomics do)."""


@functools.lru_cache(maxsize=512)
def _fragment(text: str) -> tuple[Node, Callable[[int], int]]:
    """Statements or an expression parsed as a function body: (root, fragment byte offset -> character offset)."""
    data = text.encode("utf-8")
    # A trailing ";" ends an expression fragment; after statements it is an empty statement.
    root = Parser(CUDA_LANGUAGE).parse(_WRAP_HEAD + data + b"\n;" + _WRAP_TAIL).root_node
    to_char = _char_offsets(text, data)
    return root, lambda offset: to_char(offset - len(_WRAP_HEAD))


def _nodes(root: Node, kind: str) -> list[Node]:
    found, stack = [], [root]
    while stack:
        node = stack.pop()
        if node.type == kind:
            found.append(node)
        stack.extend(reversed(node.children))
    return found


def _is_written(node: Node) -> bool:
    """Whether the element ``node`` (a subscript) is a store target: climbs members and further subscripts."""
    while node.parent is not None:
        parent = node.parent
        if parent.type in ("subscript_expression", "field_expression") and parent.child_by_field_name("argument") == node:
            node = parent
        elif parent.type == "parenthesized_expression":
            node = parent
        else:
            break
    parent = node.parent
    if parent is None:
        return False
    if parent.type == "assignment_expression":
        return parent.child_by_field_name("left") == node
    if parent.type == "update_expression":
        return True
    return parent.type == "pointer_expression" and (parent.child_by_field_name("operator") is not None
                                                   and parent.child_by_field_name("operator").type == "&")


def subscripts(masked: str, name: str) -> list[Subscript]:
    """Every ``name[...]`` in masked text, as tree-sitter parses it (nested ones appear separately)."""
    root, to_char = _fragment(masked)
    out = []
    for node in _nodes(root, "subscript_expression"):
        argument, indices = node.child_by_field_name("argument"), node.child_by_field_name("indices")
        if argument is None or indices is None or argument.type != "identifier":
            continue
        start, end = to_char(argument.start_byte), to_char(node.end_byte)
        if masked[start:to_char(argument.end_byte)] != name or masked[end - 1 : end] != "]":
            continue
        out.append(Subscript(name, start, end, masked[to_char(indices.start_byte) + 1 : end - 1], _is_written(node)))
    return out


def occurrences(masked: str, name: str) -> list[int]:
    """Offsets of identifier ``name`` (not a member ``.name`` / ``->name``), as tree-sitter parses it."""
    root, to_char = _fragment(masked)
    return [to_char(n.start_byte) for n in _nodes(root, "identifier") if masked[to_char(n.start_byte) : to_char(n.end_byte)] == name]


def rewrite_subscripts(masked: str, text: str, names: Iterable[str], fn: Callable[[str, str], str]) -> str:
    """Replace every ``name[index]`` read with ``fn(name, rewritten_index)``, innermost first.

    ``masked`` and ``text`` are the same length (``masked = mask(text)``).
    """
    names = set(names)
    if not names:
        return text
    found = sorted((s for n in names for s in subscripts(masked, n)), key=lambda s: s.start)
    out: list[str] = []
    pos = 0
    for sub in found:
        if sub.start < pos:
            continue  # inside the index of one already rewritten: the recursion below handled it
        open_at = masked.index("[", sub.start + len(sub.name))
        inner = rewrite_subscripts(masked[open_at + 1 : sub.end - 1], text[open_at + 1 : sub.end - 1], names, fn)
        out.append(text[pos : sub.start])
        out.append(fn(sub.name, inner))
        pos = sub.end
    out.append(text[pos:])
    return "".join(out)


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
    """The type (with ``const``, spaces squeezed) of the first initialized declaration of ``name`` in the
    fragment, as tree-sitter parses it; None when there is none."""
    root, to_char = _fragment(masked)
    for node in _nodes(root, "declaration"):
        type_node = node.child_by_field_name("type")
        if type_node is None:
            continue
        for declarator in node.children_by_field_name("declarator"):
            target = declarator.child_by_field_name("declarator") if declarator.type == "init_declarator" else None
            if target is not None and target.type == "identifier" and masked[to_char(target.start_byte) : to_char(target.end_byte)] == name:
                words = [masked[to_char(c.start_byte) : to_char(c.end_byte)] for c in node.children if c.type == "type_qualifier"]
                words.append(masked[to_char(type_node.start_byte) : to_char(type_node.end_byte)])
                return " ".join(" ".join(words).split())
    return None
