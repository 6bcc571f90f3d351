"""A counted loop's header as places to edit, however the loop is written.

Real code counts its loops in three ways: ``for (int j = 0; j < n; ++j)``, a ``for`` whose counter was
set before it (``int j = 0; for (; j < n; ++j)``), and a ``while`` loop stepped by one statement of its
body (``int i = start; while (i < n) { …; i += stride; }``, the grid-stride loop of many reductions).
The analysis finds the same counter in all three (:class:`~kernel_lsp.core.analysis.LoopFact`: ``var``,
``start``, ``step``, ``update_span``); a transformation that moves where the counter starts or how far
it steps (a loop split across lanes or threads) edits it through :class:`CountedLoop`, which knows
where each way of writing keeps the start and the step.

Legality, each refusal naming the fact that is missing:
- the analysis found the counter and the statement that steps it;
- a ``do`` loop runs its first iteration before its test (its start cannot be moved ahead of it);
- in a ``while`` loop, nothing after the step in the body reads the counter (it would see the new
  step's value, not the old one); a ``continue`` that would skip the step leaves the analysis without
  a counter;
- a counter the loop does not declare must be dead when the loop ends, on every path: after the loop,
  and around every loop that encloses it (:func:`counter_dead_after`): each lane or thread of the
  rewritten loop ends it at its own value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tree_sitter import Node

from kernel_lsp.core.analysis import LoopFact, node_text
from kernel_lsp.core.transforms.emit import BodyEdit

_LOOPS = ("for_statement", "while_statement", "do_statement", "for_range_loop")


@dataclass(frozen=True)
class CountedLoop:
    node: Node
    """The loop statement."""
    var: str
    start: Node | None
    """The value the loop's own initializer gives the counter; None when the counter is set before the loop."""
    step: Node
    """The expression that steps the counter: the ``for`` header's update or the ``while`` body's statement."""

    @property
    def initializer(self) -> Node | None:
        """The ``for`` header's initializer (``int j = 0`` or ``j = 0``); None when the counter is set before."""
        return self.node.child_by_field_name("initializer") if self.start is not None else None

    @property
    def test(self) -> Node | None:
        """The loop's condition as an expression (a ``while``'s without its parentheses)."""
        return loop_test(self.node)

    @property
    def step_statement(self) -> Node | None:
        """The body's statement that steps the counter (a ``while`` loop's); None for a ``for`` header's update."""
        return self.step.parent if self.node.type == "while_statement" else None

    def without_step(self) -> list[tuple[int, int, str]]:
        """Substitutions that drop the step statement from a copy of the body (a rebuilt ``for`` header steps
        the counter instead)."""
        statement = self.step_statement
        return [(statement.start_byte, statement.end_byte, "")] if statement is not None else []

    def restart(self, edit: BodyEdit, start: Callable[[str], str]) -> None:
        """Start the counter at ``start(old start)``: the initializer's value is replaced, or, when the counter
        is set before the loop, it is moved just before the loop (inside braces, so a loop that is the body
        of an ``if`` stays one statement)."""
        if self.start is not None:
            old = edit.text(self.start.start_byte, self.start.end_byte)
            edit.replace(self.start.start_byte, self.start.end_byte, start(old))
            return
        edit.insert(self.node.start_byte, f"{{ {self.var} = {start(self.var)};\n{edit.indent_at(self.node.start_byte)}")
        edit.insert(self.node.end_byte, " }")

    def restep(self, edit: BodyEdit, update: str) -> None:
        """Step the counter by ``update`` (an expression statement's expression: ``j += 32``)."""
        edit.replace(self.step.start_byte, self.step.end_byte, update)


def counted_loop(loop: LoopFact, node: Node | None, body_span: tuple[int, int], src: bytes,
                 ends_elsewhere: bool = True) -> tuple[CountedLoop | None, str]:
    """The loop's counter as places to edit, or why its start or step cannot be moved. ``ends_elsewhere``: the
    rewrite may leave the counter at another value when the loop ends (then it must be dead there); a caller
    that keeps the loop's last value, or checks the counter's later uses itself, passes False."""
    if loop.kind == "do":
        return None, "it is a do loop (its first iteration runs before its test)"
    if node is None or loop.var is None or loop.update_span is None:
        return None, "the analysis finds no counter of the loop (a variable started, tested and stepped)"
    var = loop.var
    step = node.descendant_for_byte_range(*loop.update_span)
    while step is not None and (step.start_byte, step.end_byte) != loop.update_span:
        step = step.parent
    if step is None:
        return None, "the statement that steps its counter was not found"
    start = None
    init = node.child_by_field_name("initializer")
    if node.type == "for_statement" and init is not None:
        start = _init_value(init, var, src)
        if start is None:
            return None, f"its initializer does not set the counter `{var}` alone"
    if node.type == "while_statement":
        statement = step.parent
        if statement is not None and statement.parent is not None and _mentions_after(statement, var, src):
            return None, f"its body reads the counter `{var}` after stepping it"
    if ends_elsewhere and (init is None or init.type != "declaration"):
        if not counter_dead_after(node, var, body_span, src):
            return None, f"its counter `{var}` is read after it (the rewritten loop ends it at another value)"
    return CountedLoop(node, var, start, step), ""


def loop_test(node: Node) -> Node | None:
    """A ``for`` or ``while`` loop's condition as an expression (a ``while``'s without its parentheses)."""
    cond = node.child_by_field_name("condition")
    if cond is not None and cond.type in ("condition_clause", "parenthesized_expression"):
        return cond.child_by_field_name("value") or (cond.named_children[-1] if cond.named_children else None)
    return cond


def counter_dead_after(loop: Node, var: str, body_span: tuple[int, int], src: bytes) -> bool:
    """The counter's value when ``loop`` ends is never read: on the path past the loop and, for every loop
    around it, on the path back round to its next iteration, the first mention of the counter sets it
    (``var = e`` without ``var`` in ``e``, or a declaration), or there is none; going round to ``loop``
    itself counts as a read unless ``loop``'s initializer sets the counter."""
    root = loop
    while root.parent is not None:
        root = root.parent
    body = root.descendant_for_byte_range(*body_span) or root
    mentions = sorted(_mentions(body, var, src), key=lambda n: n.start_byte)
    after = [m for m in mentions if m.start_byte >= loop.end_byte]
    if after and not _sets(after[0], var, src):
        return False
    sets_itself = loop.type == "for_statement" and _init_value(loop.child_by_field_name("initializer"), var, src) is not None
    outer = loop.parent
    while outer is not None and outer.start_byte >= body_span[0]:
        if outer.type in _LOOPS:
            rest = [m for m in after if m.end_byte <= outer.end_byte]
            if not rest:
                around = [m for m in mentions if outer.start_byte <= m.start_byte < loop.start_byte]
                if around and not _sets(around[0], var, src):
                    return False
                if not around and not sets_itself:
                    return False
        outer = outer.parent
    return True


def set_first(body: Node, var: str, src: bytes) -> bool:
    """Every run of ``body`` sets ``var`` before it reads it: the first mention of ``var`` is a plain assignment
    that does not read it (``var = e;`` or a ``for`` header's ``var = e``), made by a statement of the body's own
    block, which runs whenever the body does. The value a previous run left is then never read."""
    statements = body.named_children if body.type == "compound_statement" else [body]
    for statement in statements:
        mentions = _mentions(statement, var, src)
        if not mentions:
            continue
        first = min(mentions, key=lambda n: n.start_byte)
        if not _sets(first, var, src) or first.parent is None or first.parent.type != "assignment_expression":
            return False
        if statement.type == "expression_statement":
            return bool(statement.named_children) and statement.named_children[0] == first.parent
        return statement.type == "for_statement" and statement.child_by_field_name("initializer") == first.parent
    return False


def value_set_before(node: Node, var: str, src: bytes) -> Node | None:
    """The value the statement right before ``node`` gives ``var`` (``int var = v;`` or ``var = v;``, a statement of
    that alone), or None: where a ``while`` loop's counter starts."""
    prev = node.prev_named_sibling
    while prev is not None and prev.type == "comment":
        prev = prev.prev_named_sibling
    if prev is None:
        return None
    if prev.type == "declaration":
        return _init_value(prev, var, src)
    if prev.type == "expression_statement" and prev.named_child_count == 1:
        return _init_value(prev.named_children[0], var, src)
    return None


def _init_value(init: Node | None, var: str, src: bytes) -> Node | None:
    """The value ``init`` gives ``var`` when that is all it does (``int j = e`` or ``j = e``)."""
    if init is None:
        return None
    if init.type == "declaration":
        declarators = init.children_by_field_name("declarator")
        if len(declarators) != 1 or declarators[0].type != "init_declarator":
            return None
        name = declarators[0].child_by_field_name("declarator")
        return declarators[0].child_by_field_name("value") if name is not None and node_text(src, name) == var else None
    if init.type == "assignment_expression":
        left = init.child_by_field_name("left")
        if left is not None and left.type == "identifier" and node_text(src, left) == var \
                and node_text(src, init.child_by_field_name("operator")) == "=":
            return init.child_by_field_name("right")
    return None


def _mentions(node: Node, var: str, src: bytes) -> list[Node]:
    found = []
    stack = [node]
    while stack:
        n = stack.pop()
        if n.type == "identifier":
            if node_text(src, n) == var:
                found.append(n)
            continue
        stack.extend(n.children)
    return found


def _sets(mention: Node, var: str, src: bytes) -> bool:
    """``mention`` is the counter being given a value that does not read it."""
    parent = mention.parent
    if parent is None:
        return False
    if parent.type == "assignment_expression" and parent.child_by_field_name("left") == mention:
        right = parent.child_by_field_name("right")
        return node_text(src, parent.child_by_field_name("operator")) == "=" and (
            right is None or not _mentions(right, var, src))
    if parent.type == "init_declarator" and parent.child_by_field_name("declarator") == mention:
        value = parent.child_by_field_name("value")
        return value is None or not _mentions(value, var, src)
    return parent.type == "declaration"


def _mentions_after(statement: Node, var: str, src: bytes) -> bool:
    """A statement after ``statement`` in its block mentions ``var``."""
    sibling = statement.next_named_sibling
    while sibling is not None:
        if _mentions(sibling, var, src):
            return True
        sibling = sibling.next_named_sibling
    return False
