"""Verified rewrites as the editor's own answers: the pure part of the distillation data.

The editor job (:mod:`kernel_lsp.services.model_jobs`) answers with hunks whose ``search`` is one whole
line of the kernel that occurs once in it, and whose ``replace`` is what that line becomes. A rewrite the
harness accepted (before and after the kernel) is a training answer when it can be written that way:
:func:`hunks_between` finds the hunks from a line diff and keeps them only when applying them gives the
rewrite back (blank lines aside: deleting a line leaves it empty). :func:`rename_locals` makes a variant
of a before/after pair that carries the same transformation: the kernel's locals renamed alike in both, through the syntax tree (never inside strings, comments or other names).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence

from kernel_lsp.core.analysis.syntax import node_text, parse_text
from kernel_lsp.core.hunks import Hunk, apply_hunks, searchable_lines


def _without_blank_lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines() if line.strip()]


def hunks_between(before: str, after: str) -> list[Hunk] | None:
    """The editor's hunks that turn kernel ``before`` into ``after``, or None when they cannot be written
    (a changed line that is blank or not unique, an insertion with no unique neighbour)."""
    old, new = before.splitlines(), after.splitlines()
    searchable = set(searchable_lines(before))
    hunks: list[Hunk] = []
    used: set[int] = set()
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        if tag == "insert":
            inserted = new[j1:j2]
            if i1 > 0 and i1 - 1 not in used and old[i1 - 1] in searchable:
                hunks.append(Hunk(old[i1 - 1], "\n".join([old[i1 - 1], *inserted])))
                used.add(i1 - 1)
            elif i1 < len(old) and old[i1] in searchable:
                hunks.append(Hunk(old[i1], "\n".join([*inserted, old[i1]])))
                used.add(i1)
            else:
                return None
            continue
        lines = range(i1, i2)
        if any(i in used or old[i] not in searchable for i in lines):
            return None
        hunks.append(Hunk(old[i1], "\n".join(new[j1:j2])))
        hunks.extend(Hunk(old[i], "") for i in lines[1:])
        used.update(lines)
    # Each hunk is a line of a text that earlier hunks already changed: kept only when the whole answer,
    # applied as the editor applies it, is the rewrite.
    result = apply_hunks(before, hunks)
    if not hunks or result.failures or _without_blank_lines(result.text) != _without_blank_lines(after):
        return None
    return hunks


def _declared(node, src: bytes) -> str | None:
    """The name a declarator declares (through pointers, arrays, references and an initialiser)."""
    while node is not None and node.type != "identifier":
        inner = node.child_by_field_name("declarator")
        node = inner if inner is not None else next((c for c in node.named_children if c.type.endswith(
            ("identifier", "declarator"))), None)
    return node_text(src, node) if node is not None else None


def declared_names(kernel_text: str) -> tuple[str, ...]:
    """The kernel's local variable names, in the order they are declared (not its parameters: a launch
    spec names them, so a variant renames only the locals)."""
    src, root = parse_text(kernel_text)
    names: list[str] = []
    stack = [root]
    while stack:
        node = stack.pop()
        if node.type == "declaration":
            for declarator in node.children_by_field_name("declarator"):
                name = _declared(declarator, src)
                if name is not None and name not in names:
                    names.append(name)
        stack.extend(reversed(node.children))
    return tuple(names)


def rename_locals(texts: Sequence[str], mapping: Mapping[str, str]) -> tuple[str, ...] | None:
    """``texts`` (a kernel before and after a rewrite) with every identifier of ``mapping`` renamed, the
    same in each; None when a new name is already an identifier of one of them (it would be captured)."""
    out = []
    for text in texts:
        src, root = parse_text(text)
        spans: list[tuple[int, int, str]] = []
        seen: set[str] = set()
        stack = [root]
        while stack:
            node = stack.pop()
            if node.type == "identifier":
                name = node_text(src, node)
                seen.add(name)
                if name in mapping:
                    spans.append((node.start_byte, node.end_byte, mapping[name]))
            stack.extend(node.children)
        if seen & set(mapping.values()):
            return None
        data = src
        for start, end, name in sorted(spans, reverse=True):
            data = data[:start] + name.encode() + data[end:]
        out.append(data.decode("utf-8", "replace"))
    return tuple(out)


_THREAD_INDICES = ("threadIdx", "blockIdx", "blockDim", "gridDim")


def _int_declarations(src: bytes, root) -> list[tuple[object, str, str]]:  # noqa: ANN001 - tree-sitter nodes
    """(the ``int`` type node, the name, its initial value's text) of every one-name ``int`` declaration."""
    found = []
    stack = [root]
    while stack:
        node = stack.pop()
        if node.type == "declaration":
            kind = node.child_by_field_name("type")
            declarators = node.children_by_field_name("declarator")
            if kind is not None and node_text(src, kind) == "int" and len(declarators) == 1 \
                    and declarators[0].type == "init_declarator":
                name = _declared(declarators[0], src)
                value = declarators[0].child_by_field_name("value")
                if name is not None and value is not None:
                    found.append((kind, name, node_text(src, value)))
        stack.extend(node.children)
    return found


def widen_indices(texts: Sequence[str]) -> tuple[str, ...] | None:
    """``texts`` (a kernel before and after a rewrite) with the ``int`` locals that the kernel's first text
    computes from thread and block indices declared ``long`` instead, in each text alike; None when there
    is no such local, or one of the texts does not declare it as ``int`` too."""
    src, root = parse_text(texts[0])
    names = {name for _, name, value in _int_declarations(src, root) if any(i in value for i in _THREAD_INDICES)}
    if not names:
        return None
    out = []
    for text in texts:
        data, root = parse_text(text)
        declared = _int_declarations(data, root)
        if {name for _, name, _ in declared} & names != names:
            return None
        for kind in sorted((k for k, name, _ in declared if name in names), key=lambda k: k.start_byte, reverse=True):
            data = data[:kind.start_byte] + b"long" + data[kind.end_byte:]
        out.append(data.decode("utf-8", "replace"))
    return tuple(out)
