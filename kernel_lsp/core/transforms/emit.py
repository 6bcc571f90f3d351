"""A small code emitter: edits on a kernel's preprocessed body, spliced back into the user's file.

Transformations decide from the access analysis, whose byte ranges refer to the preprocessed
text; they edit that text (:class:`BodyEdit`) and the result replaces the kernel's body in the
file the user wrote (:func:`splice_body`). The kernel's signature, the rest of the file and
every macro definition stay as written. A rewrite that rebuilds the body from its statements
copies them from the user's text (:class:`UserText`, checked by :func:`expands_to`); only where
that fails does a macro used inside the body appear expanded in the candidate (its description
says so).
"""

from __future__ import annotations

import bisect
import difflib
import re

from dataclasses import dataclass, field

from tree_sitter import Node

from kernel_lsp.core.analysis import KernelFacts, node_text, parse_text
from kernel_lsp.core.index import Function
from kernel_lsp.core.source import Preprocessed, blank_comments, preprocess


class EmitError(ValueError):
    """Edits that overlap or fall outside the kernel's body: a transformation bug, refused."""


@dataclass
class BodyEdit:
    pre: Preprocessed
    facts: KernelFacts
    edits: list[tuple[int, int, str, str | None]] = field(default_factory=list)
    """(start, end, new text, the new text as the user's file writes it, macros kept, or None: the same)."""

    def __post_init__(self) -> None:
        self.src = self.pre.text.encode("utf-8")

    def text(self, start: int, end: int) -> str:
        return self.src[start:end].decode("utf-8")

    def indent_at(self, at: int) -> str:
        """The whitespace before the first non-blank character of ``at``'s line."""
        line_start = self.src.rfind(b"\n", 0, at) + 1
        line = self.src[line_start:at].decode("utf-8")
        return line[: len(line) - len(line.lstrip())]

    def replace(self, start: int, end: int, new: str, user: str | None = None) -> None:
        """``user``: ``new`` as the user's text writes it (``r[k*NJ + j]`` for ``r[k*2048 + j]``; ``new``
        itself when it holds nothing expanded), used when the edits go onto the user's text; what it
        replaces may then hold a macro, and the result is checked to expand to the edit."""
        lo, hi = self.facts.body_span
        if not lo <= start <= end <= hi:
            raise EmitError(f"edit {start}-{end} outside the kernel body {lo}-{hi}")
        self.edits.append((start, end, new, user))

    def insert(self, at: int, new: str, user: str | None = None) -> None:
        self.replace(at, at, new, user)

    def body(self) -> str:
        lo, hi = self.facts.body_span
        out: list[bytes] = []
        at = lo
        for start, end, new, _ in sorted(self.edits, key=lambda e: (e[0], e[1])):
            if start < at:
                raise EmitError(f"overlapping edits at byte {start}")
            out.append(self.src[at:start])
            out.append(new.encode("utf-8"))
            at = end
        out.append(self.src[at:hi])
        return b"".join(out).decode("utf-8")

    def onto(self, source: str, function: Function) -> str | None:
        """The edits applied to the user's own text of the kernel (macros kept as written), or None when
        one of them falls where the preprocessed line differs from the user's around it (inside a
        macro's expansion): the caller then splices the expanded body instead.

        An edit maps when the text it replaces is the same in both lines and so is everything before it
        on its line, or everything after it (``a * BLOCK + threadIdx.x``: the edit of ``threadIdx.x``
        maps from the line's end although ``BLOCK`` was expanded before it).
        """
        if function.body_span is None:
            return None
        pre_text = self.src.decode("utf-8")
        pre_lines = pre_text.split("\n")
        user_lines = blank_comments(source).split("\n")
        raw_lines = source.split("\n")
        line_starts_pre = _line_starts(pre_lines)
        # Line starts in bytes (latin-1 maps each byte to one character, so lengths are byte counts).
        byte_starts = _line_starts([line.encode("utf-8").decode("latin-1") for line in raw_lines])
        data = source.encode("utf-8")
        body_lo, body_hi = function.body_span.start_byte, function.body_span.end_byte
        placed: list[tuple[int, int, str]] = []
        aligned: _Aligned | None = None
        for start, end, pre_new, user_new in self.edits:
            new = pre_new if user_new is None else user_new
            if start == end == self.facts.body_span[0] + 1:
                placed.append((body_lo + 1, body_lo + 1, new))
                continue
            found = self._by_line(start, end, pre_lines, user_lines, raw_lines, line_starts_pre, byte_starts)
            if found is None:
                # A macro expanded on both sides of the edit (``a[i * NY + j]``): the tokens around it
                # place it, and the whole result is checked against the preprocessed edit below.
                aligned = aligned or _Aligned(UserText(self.pre, self.facts, source, function))
                found = aligned.place(start, end, user_new is not None)
                if found is None:
                    return None
            b1, b2 = found
            if not body_lo < b1 <= b2 < body_hi:
                return None
            placed.append((b1, b2, new))
        out = data
        last = None
        for b1, b2, new in sorted(placed, key=lambda e: (e[0], e[1]), reverse=True):
            if last is not None and b2 > last:
                return None
            out = out[:b1] + new.encode("utf-8") + out[b2:]
            last = b1
        text = out.decode("utf-8")
        if aligned is not None or any(e[3] is not None for e in self.edits):
            grown = sum(len(new.encode("utf-8")) - (b2 - b1) for b1, b2, new in placed)
            if not expands_to(out[body_lo:body_hi + grown].decode("utf-8"), self.body(), self.pre):
                return None
        return text

    def _by_line(self, start: int, end: int, pre_lines: list[str], user_lines: list[str], raw_lines: list[str],
                 line_starts_pre: list[int], byte_starts: list[int]) -> tuple[int, int] | None:
        """The file's byte range of the edit ``start..end`` when its line reads the same before it or
        after it in both texts."""
        cs, ce = len(self.src[:start].decode("utf-8")), len(self.src[:end].decode("utf-8"))
        line = _line_of(line_starts_pre, cs)
        if _line_of(line_starts_pre, ce) != line:
            return None
        user = self.pre.user_line(line)
        if user is None or user >= len(user_lines):
            return None
        pre_line, user_line = pre_lines[line], user_lines[user]
        c1, c2 = cs - line_starts_pre[line], ce - line_starts_pre[line]
        old = pre_line[c1:c2]
        if pre_line[:c1] == user_line[:c1] and user_line[c1:c2] == old:
            u1 = c1
        else:
            tail = pre_line[c2:]
            u2 = len(user_line) - len(tail)
            if not user_line.endswith(tail) or u2 - len(old) < 0 or user_line[u2 - len(old):u2] != old:
                return None
            u1 = u2 - len(old)
        raw = raw_lines[user]
        # The file is addressed in bytes: the line's start, then the column's characters encoded.
        b1 = byte_starts[user] + len(raw[:u1].encode("utf-8"))
        return b1, b1 + len(raw[u1:u1 + len(old)].encode("utf-8"))


def _line_starts(lines: list[str]) -> list[int]:
    starts, at = [], 0
    for line in lines:
        starts.append(at)
        at += len(line) + 1
    return starts


def _line_of(starts: list[int], offset: int) -> int:
    return bisect.bisect_right(starts, offset) - 1


def unit_start(source: str, function: Function) -> int:
    """Byte offset of the line where the kernel's definition starts, template header and a
    ``extern "C"`` wrapping it included: where helpers it needs are inserted."""
    src, root = parse_text(source)
    node: Node | None = root.descendant_for_byte_range(function.span.start_byte, function.span.start_byte)
    while node is not None and node.type != "function_definition":
        node = node.parent
    start = function.span.start_byte
    while node is not None:
        if node.type in ("function_definition", "template_declaration") or (
                node.type == "linkage_specification" and node.named_child_count <= 2):
            start = min(start, node.start_byte)
        elif node.type != "declaration_list":
            break
        node = node.parent
    return src.rfind(b"\n", 0, start) + 1


def emit(edit: BodyEdit, source: str, function: Function, helpers: str = "") -> tuple[str, bool]:
    """(the new file, whether macros had to be expanded): the edits on the user's own text when they
    all map there, else the expanded body spliced in."""
    onto = edit.onto(source, function)
    if onto is not None:
        if helpers:
            at = unit_start(onto, function)
            onto = (onto.encode("utf-8")[:at] + helpers.encode("utf-8") + onto.encode("utf-8")[at:]).decode("utf-8")
        return onto, False
    return splice_body(source, function, edit.body(), helpers), True


def splice_body(source: str, function: Function, new_body: str, helpers: str = "") -> str:
    """The user's file with ``function``'s body replaced by ``new_body`` and ``helpers`` (device
    functions the new body calls) inserted before the kernel's definition."""
    if function.body_span is None:
        raise EmitError("the kernel has no body in this file")
    src = source.encode("utf-8")
    start, end = function.body_span.start_byte, function.body_span.end_byte
    out = src[:start] + new_body.encode("utf-8") + src[end:]
    if helpers:
        at = unit_start(source, function)
        out = out[:at] + helpers.encode("utf-8") + out[at:]
    return out.decode("utf-8")


def node_at(pre_src: bytes, root: Node, span: tuple[int, int]) -> Node | None:
    node = root.descendant_for_byte_range(span[0], span[1])
    while node is not None and (node.start_byte, node.end_byte) != span:
        node = node.parent
    return node


def declared_type(decl: Node, var: str, src: bytes) -> str | None:
    """The type, qualifiers first, that the declaration ``decl`` gives ``var``; None when it does not declare it."""
    for child in decl.children_by_field_name("declarator"):
        name = child.child_by_field_name("declarator") if child.type == "init_declarator" else child
        if name is not None and name.type == "identifier" and node_text(src, name) == var:
            kind = decl.child_by_field_name("type")
            quals = " ".join(node_text(src, c) for c in decl.children if c.type == "type_qualifier")
            return f"{quals} {node_text(src, kind)}".strip() if kind is not None else None
    return None


def type_seen_at(node: Node, name: str, src: bytes) -> str | None:
    """The declared type (qualifiers first) of ``name`` as the code at ``node`` sees it: the nearest declaration
    before it in an enclosing block, else a scalar parameter of the enclosing function; None when neither."""
    while node.parent is not None:
        parent = node.parent
        if parent.type == "compound_statement":
            earlier = [c for c in parent.named_children if c.end_byte <= node.start_byte and c.type == "declaration"]
            for c in reversed(earlier):
                kind = declared_type(c, name, src)
                if kind is not None:
                    return kind
        if parent.type == "function_definition":
            declarator = parent.child_by_field_name("declarator")
            params = declarator.child_by_field_name("parameters") if declarator is not None else None
            for p in params.named_children if params is not None else []:
                kind = declared_type(p, name, src) if p.type == "parameter_declaration" else None
                if kind is not None:
                    return kind
            return None
        node = parent
    return None


def user_line_of(pre: Preprocessed, line: int) -> int:
    """The 1-based line of the user's file that the preprocessed view's 0-based ``line`` comes from (the view's own
    line, 1-based, where it comes from a header): what a refusal names."""
    mapped = pre.user_line(line)
    return (mapped if mapped is not None else line) + 1


def parse(pre: Preprocessed) -> tuple[bytes, Node]:
    return parse_text(pre.text)


WARP_REDUCE = {
    "+": "kl_warp_sum",
    "max": "kl_warp_max",
    "min": "kl_warp_min",
}


def warp_reduce_helpers(ops: set[str], source: str) -> str:
    """Butterfly reductions over a full warp (every lane gets the result), for the operators a
    transformation needs and the file does not define yet."""
    bodies = {
        "+": "v += __shfl_xor_sync(0xffffffffu, v, o);",
        "max": "v = max(v, __shfl_xor_sync(0xffffffffu, v, o));",
        "min": "v = min(v, __shfl_xor_sync(0xffffffffu, v, o));",
    }
    out = []
    for op in sorted(ops):
        name = WARP_REDUCE[op]
        if name in source:
            continue
        out.append(f"template <typename T>\n__device__ __forceinline__ T {name}(T v) {{\n"
                   f"    for (int o = 16; o > 0; o >>= 1) {bodies[op]}\n    return v;\n}}\n")
    return "".join(out)


_TOKEN = re.compile(rb"[A-Za-z_0-9.]+|\"(?:[^\"\\\n]|\\.)*\"|'(?:[^'\\\n]|\\.)*'|\S")


def _tokens(data: bytes, lo: int, hi: int) -> list[tuple[int, int, bytes]]:
    return [(lo + m.start(), lo + m.end(), m.group()) for m in _TOKEN.finditer(data[lo:hi])]


class UserText:
    """The user's own text (macros as written) for spans of the kernel's preprocessed body.

    A rewrite that builds a new body from statements of the old one copies them from here, so the
    candidate keeps ``NJ`` where the user wrote ``NJ`` (not the ``4096`` it expands to). The two
    bodies are aligned token by token; a span maps when its first and last tokens are aligned, a
    substitution inside it likewise (what it replaces may hold a macro's name). Alignment is a heuristic, so the
    caller checks the result with :func:`expands_to` before using it.
    """

    def __init__(self, pre: Preprocessed, facts: KernelFacts, source: str, function: Function):
        self.pre_src = pre.text.encode("utf-8")
        # Comments blanked byte for byte, so offsets stay those of the user's file.
        self.user_src = b"".join(c.encode("utf-8") if b == c else b" " * len(c.encode("utf-8"))
                                 for c, b in zip(source, blank_comments(source)))
        self.raw_src = source.encode("utf-8")
        """The user's text with its comments, at the same byte offsets."""
        self.ok = function.body_span is not None
        if not self.ok:
            return
        self.pre_tokens = _tokens(self.pre_src, *facts.body_span)
        self.user_tokens = _tokens(self.user_src, function.body_span.start_byte, function.body_span.end_byte)
        matcher = difflib.SequenceMatcher(None, [t[2] for t in self.pre_tokens], [t[2] for t in self.user_tokens],
                                          autojunk=False)
        self.match: dict[int, int] = {}
        for a, b, size in matcher.get_matching_blocks():
            for k in range(size):
                self.match[a + k] = b + k
        self.starts = [t[0] for t in self.pre_tokens]
        self.ends = [t[1] for t in self.pre_tokens]

    def _range(self, lo: int, hi: int) -> tuple[int, int, int, int] | None:
        """(first, last pre token, first, last user token) of the pre span [lo, hi) (blanks around
        it left out), or None."""
        i0 = bisect.bisect_left(self.starts, lo)
        i1 = bisect.bisect_right(self.ends, hi) - 1
        if i0 >= len(self.starts) or i1 < i0 or self.pre_src[lo:self.starts[i0]].strip() or \
                self.pre_src[self.ends[i1]:hi].strip():
            return None
        u0, u1 = self._user_start(i0), self._user_end(i1)
        if u0 is None or u1 is None or u1 < u0:
            return None
        return i0, i1, u0, u1

    def _user_start(self, i: int) -> int | None:
        """The user token where pre token ``i`` starts: its match, or, when it begins a run of
        tokens from a macro's expansion (``DATA_TYPE`` written, ``float`` seen), the first user
        token after the previous match."""
        if i in self.match:
            return self.match[i]
        if i > 0 and i - 1 not in self.match:
            return None
        return self.match[i - 1] + 1 if i > 0 else None

    def _user_end(self, i: int) -> int | None:
        if i in self.match:
            return self.match[i]
        if i + 1 not in self.match:
            return None
        return self.match[i + 1] - 1

    def user_range(self, lo: int, hi: int) -> tuple[int, int] | None:
        """The user's byte range holding the code of the preprocessed span [lo, hi)."""
        if not self.ok:
            return None
        found = self._range(lo, hi)
        if found is None:
            return None
        _, _, u0, u1 = found
        return self.user_tokens[u0][0], self.user_tokens[u1][1]

    def span(self, lo: int, hi: int, subs: list[tuple[int, int, str]] | tuple = (), raw: bool = False) -> str | None:
        """The user's text of the preprocessed span [lo, hi) with ``subs`` (pre spans inside it and
        their new text) applied (its comments kept when ``raw``); None when some part does not map."""
        outer = self.user_range(lo, hi)
        if outer is None:
            return None
        placed = []
        for s, e, new in subs:
            if s == e:
                return None
            found = self._range(s, e)
            if found is None:
                return None
            _, _, u0, u1 = found
            placed.append((self.user_tokens[u0][0], self.user_tokens[u1][1], new))
        text = self.raw_src if raw else self.user_src
        out, at = [], outer[0]
        for s, e, new in sorted(placed):
            if s < at:
                return None
            out += [text[at:s].decode("utf-8"), new]
            at = e
        out.append(text[at:outer[1]].decode("utf-8"))
        return "".join(out)


class _Aligned:
    """Edits of the preprocessed body placed in the user's text through :class:`UserText`'s token
    alignment: an insertion at an aligned token's start or end, a replacement of the user's tokens
    from the one aligned with its first to the one aligned with its last."""

    def __init__(self, user: UserText):
        self.user = user
        if user.ok:
            self.at_start = {user.starts[i]: user.user_tokens[j][0] for i, j in user.match.items()}
            self.at_end = {user.ends[i]: user.user_tokens[j][1] for i, j in user.match.items()}

    def place(self, start: int, end: int, written: bool) -> tuple[int, int] | None:
        """``written``: the edit's new text is written for the user's text, so what it replaces may hold
        a macro (``r[k*NJ + j]`` replaced by ``kl_acc0``); other replacements carry preprocessed text,
        which would stand where the user wrote a macro, and need the same text in both."""
        if not self.user.ok:
            return None
        if start == end:
            at = self.at_start.get(start, self.at_end.get(start))
            return None if at is None else (at, at)
        found = self.user.user_range(start, end)
        if found is None or not written and self.user.user_src[found[0]:found[1]] != self.user.pre_src[start:end]:
            return None
        return found


def expands_to(user_text: str, pre_text: str, pre: Preprocessed) -> bool:
    """Whether ``user_text``, expanded with the file's macros, is ``pre_text`` token for token (the
    check that a body rebuilt from the user's text means what the rewrite built on the
    preprocessed one)."""
    lines = []
    for m in pre.macros.values():
        if m.params is None:
            lines.append(f"#define {m.name} {m.body}")
        else:
            params = ", ".join("..." if p == "__VA_ARGS__" else p for p in m.params)
            lines.append(f"#define {m.name}({params}) {m.body}")
    expanded = preprocess("\n".join(lines) + "\n" + user_text)
    if expanded.errors:
        return False
    got = expanded.text.encode("utf-8")
    want = blank_comments(pre_text).encode("utf-8")
    return [t[2] for t in _tokens(got, 0, len(got))] == [t[2] for t in _tokens(want, 0, len(want))]


def pragma_before(src: bytes, at: int) -> tuple[int, int, str] | None:
    """The ``#pragma`` right before the statement at ``at`` (nothing but blanks between): its byte range
    and text, if any."""
    line_start = src.rfind(b"\n", 0, at) + 1
    if src[line_start:at].strip():
        return None
    prev_end = line_start - 1
    while prev_end > 0:
        prev_start = src.rfind(b"\n", 0, prev_end) + 1
        raw = src[prev_start:prev_end].decode("utf-8")
        line = raw.strip()
        if line:
            if not line.startswith("#pragma"):
                return None
            lead = len(raw) - len(raw.lstrip())
            begin = prev_start + len(raw[:lead].encode("utf-8"))
            return begin, begin + len(line.encode("utf-8")), line
        prev_end = prev_start - 1
    return None


def builtin_fields(src: bytes, start: Node, lo: int, hi: int, replaced: dict[tuple[str, str], str]):
    """The builtin fields (``threadIdx.x`` …) named in ``replaced`` between ``lo`` and ``hi`` under
    ``start``, each with what replaces it."""
    stack = [start]
    while stack:
        n = stack.pop()
        if n.end_byte <= lo or n.start_byte >= hi:
            continue
        if n.type == "field_expression":
            arg, fld = n.child_by_field_name("argument"), n.child_by_field_name("field")
            if arg is not None and fld is not None:
                key = (src[arg.start_byte:arg.end_byte].decode("utf-8"), src[fld.start_byte:fld.end_byte].decode("utf-8"))
                if key in replaced:
                    yield n, replaced[key]
                    continue
        stack.extend(n.children)


class Unmapped(ValueError):
    """A span of the preprocessed body has no counterpart in the user's text (inside a macro's expansion)."""


def rebuild(pre: Preprocessed, facts: KernelFacts, source: str, function: Function,
            build, helpers: str = "") -> tuple[str, bool]:
    """The file with the kernel's body replaced by what ``build(text)`` returns: the inside of the new
    body, made of pieces ``text(lo, hi, subs)`` of the preprocessed body (a span, with ``subs`` —
    ``(lo, hi, new)`` spans inside it — replaced). The pieces are taken from the user's own text
    (macros as written) when every one maps there and the result expands to the same code, else from
    the preprocessed text; returns (the new file, whether the body was expanded)."""
    src = pre.text.encode("utf-8")

    def pre_text(lo: int, hi: int, subs=()) -> str:
        out, at = [], lo
        for s, e, new in sorted(subs):
            out += [src[at:s].decode("utf-8"), new]
            at = e
        out.append(src[at:hi].decode("utf-8"))
        return "".join(out)

    user = UserText(pre, facts, source, function)

    def user_text(lo: int, hi: int, subs=()) -> str:
        found = user.span(lo, hi, list(subs), raw=True) if lo < hi else ""
        if found is None:
            raise Unmapped(f"bytes {lo}-{hi}")
        return found

    expanded_body = build(pre_text)
    try:
        own = build(user_text)
    except Unmapped:
        own = None
    if own is not None and expands_to(own, expanded_body, pre):
        return splice_body(source, function, "{" + own + "}", helpers), False
    edit = BodyEdit(pre, facts)
    lo, hi = facts.body_span
    edit.replace(lo + 1, hi - 1, expanded_body)
    return emit(edit, source, function, helpers)


def rebuild_span(pre: Preprocessed, facts: KernelFacts, source: str, function: Function, span: tuple[int, int],
                 build, helpers: str = "") -> tuple[str, bool]:
    """The file with the statement at ``span`` of the preprocessed body replaced by what ``build(text)``
    returns (pieces as for :func:`rebuild`): in the user's own text when the statement and every piece
    map there, else through :func:`emit`; returns (the new file, whether the body was expanded)."""
    src = pre.text.encode("utf-8")

    def pre_text(lo: int, hi: int, subs=()) -> str:
        out, at = [], lo
        for s, e, new in sorted(subs):
            out += [src[at:s].decode("utf-8"), new]
            at = e
        out.append(src[at:hi].decode("utf-8"))
        return "".join(out)

    user = UserText(pre, facts, source, function)

    def user_text(lo: int, hi: int, subs=()) -> str:
        found = user.span(lo, hi, list(subs), raw=True) if lo < hi else ""
        if found is None:
            raise Unmapped(f"bytes {lo}-{hi}")
        return found

    expanded = build(pre_text)
    where = user.user_range(*span)
    try:
        own = build(user_text) if where is not None else None
    except Unmapped:
        own = None
    if own is not None and expands_to(own, expanded, pre):
        data = source.encode("utf-8")
        out = (data[:where[0]] + own.encode("utf-8") + data[where[1]:]).decode("utf-8")
        if helpers:
            at = unit_start(out, function)
            out = (out.encode("utf-8")[:at] + helpers.encode("utf-8") + out.encode("utf-8")[at:]).decode("utf-8")
        return out, False
    edit = BodyEdit(pre, facts)
    edit.replace(span[0], span[1], expanded)
    return emit(edit, source, function, helpers)
