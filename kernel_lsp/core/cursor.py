"""What is under or around the cursor, read from the tree-sitter tree (pure).

* :func:`token_at` — the smallest syntax node at a byte offset (a name, a
  keyword such as ``__launch_bounds__``), for built-in documentation on hover.
* :func:`launch_context` — whether an offset lies inside a launch's
  ``<<< >>>`` configuration or its argument list, which slot it is in and which
  kernel is launched. It walks the leaf tokens before the cursor backwards, so
  it works on the half-typed launch that signature help is asked about
  (``k<<<grid, ``), where tree-sitter has no launch node yet, only an ERROR.
"""

from __future__ import annotations

from typing import NamedTuple

from tree_sitter import Node, Tree

#: Tokens walked back at most before giving up (a launch is never that long).
MAX_TOKENS = 400
_OPEN = {")": "(", "]": "[", "}": "{", ">>>": "<<<"}
_STOP = {";", "{", "}"}


class Token(NamedTuple):
    text: str
    start_byte: int
    end_byte: int


class LaunchContext(NamedTuple):
    kernel: str
    """The launched name as written (template arguments not included)."""
    in_config: bool
    """Inside ``<<< >>>`` (True) or inside the argument list after it (False)."""
    slot: int
    """0-based: grid, block, shared memory, stream in the configuration; the argument's index otherwise."""


def _leaf_at(root: Node, offset: int) -> Node | None:
    node = root.descendant_for_byte_range(offset, offset)
    if node is None:
        return None
    while node.child_count:
        # A node spanning the offset whose children do not: take the last child ending before it.
        before = [c for c in node.children if c.start_byte < offset or c.end_byte <= offset]
        if not before:
            break
        node = before[-1]
    return node


def token_at(tree: Tree, src: bytes, offset: int) -> Token | None:
    """The leaf token containing ``offset``, or ending at it (the cursor just after a name); a name
    wins over the punctuation next to it."""
    root = tree.root_node
    found: list[Token] = []
    for probe in (offset, offset - 1):
        if probe < 0:
            continue
        node = root.descendant_for_byte_range(probe, probe + 1)
        if node is not None and node.child_count == 0 and node.start_byte <= offset <= node.end_byte:
            found.append(Token(src[node.start_byte : node.end_byte].decode("utf-8", "replace"), node.start_byte,
                               node.end_byte))
    named = [token for token in found if token.text.isidentifier()]
    return (named or found or [None])[0]


def _previous_leaf(node: Node) -> Node | None:
    while node.prev_sibling is None:
        parent = node.parent
        if parent is None:
            return None
        node = parent
    node = node.prev_sibling
    while node.child_count:
        node = node.children[-1]
    return node


def _tokens_before(root: Node, src: bytes, offset: int):
    """Leaf tokens ending at or before ``offset``, nearest first, as text."""
    node = _leaf_at(root, offset)
    while node is not None and node.end_byte > offset:
        node = _previous_leaf(node)
    count = 0
    while node is not None and count < MAX_TOKENS:
        if node.end_byte > node.start_byte and node.type != "comment":
            yield node, src[node.start_byte : node.end_byte].decode("utf-8", "replace")
            count += 1
        node = _previous_leaf(node)


def launch_context(tree: Tree, src: bytes, offset: int) -> LaunchContext | None:
    """The launch whose configuration or arguments hold ``offset``, or None."""
    tokens = _tokens_before(tree.root_node, src, offset)
    closing: list[str] = []
    commas = 0
    for _, text in tokens:
        if text in _OPEN:
            closing.append(text)
            continue
        if closing:
            if text == _OPEN[closing[-1]]:
                closing.pop()
            continue
        if text == ",":
            commas += 1
        elif text == "<<<":
            return _named(tokens, True, commas)
        elif text == "(":
            # An argument list: a launch's when ">>>" is just before it.
            previous = next(tokens, None)
            if previous is None or previous[1] != ">>>":
                return None
            depth = 1
            for _, inner in tokens:
                depth += {">>>": 1, "<<<": -1}.get(inner, 0)
                if depth == 0:
                    return _named(tokens, False, commas)
            return None
        elif text in _STOP:
            return None
    return None


def _named(tokens, in_config: bool, slot: int) -> LaunchContext | None:
    """The kernel name before a ``<<<`` (skipping ``<...>`` template arguments)."""
    depth = 0
    for node, text in tokens:
        if text == ">":
            depth += 1
        elif text == "<" and depth:
            depth -= 1
        elif depth == 0:
            if node.type in ("identifier", "field_identifier", "type_identifier", "namespace_identifier"):
                return LaunchContext(text, in_config, slot)
            if text != "::":
                return None
    return None
