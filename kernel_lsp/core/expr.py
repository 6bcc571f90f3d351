"""Integer expressions of launch specs, evaluated with C semantics and without ``eval``.

Grammar (C precedence, loosest first)::

    shift   := additive (("<<" | ">>") additive)*
    additive:= term (("+" | "-") term)*
    term    := unary (("*" | "/" | "%") unary)*
    unary   := ("-" | "+") unary | primary
    primary := INT | NAME | FUNC "(" shift ("," shift)* ")" | "(" shift ")"

``/`` truncates toward zero and ``%`` takes the sign of the dividend (C99), unlike
Python's ``//`` and ``%``. Functions: ``min(a,b)``, ``max(a,b)``, ``ceil_div(a,b)``
(the mathematical ceiling of a/b). Integer literals may be decimal or ``0x`` hex.
Values are Python ints (no wrap-around): a spec that overflows a C ``int`` is
wrong anyway, and a truthful big number is easier to diagnose than a wrapped one.

Work is bounded, because specs come from files anyone can write and are
evaluated in the editor: every literal and every intermediate value stays
within ±2^64 (:data:`MAX_ABS`, checked before a shift is computed, so
``1<<(1<<33)`` never allocates), the text is at most :data:`MAX_CHARS` long and
nested at most :data:`MAX_DEPTH` deep. Each breach is an :class:`ExprError`
that says which limit was met.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass


class ExprError(ValueError):
    """A malformed expression, an unknown name, or an impossible operation (division by zero)."""


#: Largest magnitude of any literal or intermediate value.
MAX_ABS = 2**64
#: Longest expression text, in characters.
MAX_CHARS = 1000
#: Deepest nesting of operators, calls and parentheses (the evaluator recurses once per level).
MAX_DEPTH = 64


@dataclass(frozen=True)
class Num:
    value: int


@dataclass(frozen=True)
class Name:
    name: str


@dataclass(frozen=True)
class Unary:
    op: str
    operand: Node


@dataclass(frozen=True)
class Binary:
    op: str
    left: Node
    right: Node


@dataclass(frozen=True)
class Call:
    func: str
    args: tuple[Node, ...]


Node = Num | Name | Unary | Binary | Call

_FUNCS = {"min": 2, "max": 2, "ceil_div": 2}
_TOKEN = re.compile(r"\s*(?:(0[xX][0-9a-fA-F]+|\d+)|([A-Za-z_]\w*)|(<<|>>|[-+*/%(),]))")


def _tokenize(text: str) -> list[str]:
    tokens: list[str] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            raise ExprError(f"unexpected character {text[pos:].lstrip()[:1]!r} at offset {pos}")
        tokens.append(match.group(match.lastindex or 0))
        pos = match.end()
    return tokens


def _checked(value: int) -> int:
    if -MAX_ABS <= value <= MAX_ABS:
        return value
    raise ExprError(f"value out of range: a spec expression's values must lie within ±2^64 (got about 2^{value.bit_length()})")


def _literal(token: str) -> int:
    digits = token[2:] if token[:2].lower() == "0x" else token
    # A bound on the digits before int() reads them: 2^64 has 20 decimal (16 hex) digits.
    if len(digits.lstrip("0")) > (16 if digits is not token else 20):
        raise ExprError(f"integer literal {token[:24]}… is out of range (limit 2^64)")
    return _checked(int(token, 16) if digits is not token else int(token))


class _Parser:
    def __init__(self, text: str):
        if len(text) > MAX_CHARS:
            raise ExprError(f"expression is {len(text)} characters long (limit {MAX_CHARS})")
        self.text = text
        self.tokens = _tokenize(text)
        self.pos = 0
        self.depth = 0

    def nested(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ExprError(f"expression is nested more than {MAX_DEPTH} levels deep")

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None:
            raise ExprError(f"unexpected end of expression {self.text!r}")
        if expected is not None and token != expected:
            raise ExprError(f"expected {expected!r} but found {token!r} in {self.text!r}")
        self.pos += 1
        return token

    def parse(self) -> Node:
        if not self.tokens:
            raise ExprError("empty expression")
        node = self.shift()
        if self.peek() is not None:
            raise ExprError(f"unexpected {self.peek()!r} in {self.text!r}")
        return node

    def binary_level(self, ops: tuple[str, ...], lower) -> Node:
        node = lower()
        chained = 0
        while self.peek() in ops:
            op = self.take()
            # A chain a+b+c+… is a left-deep tree: each link is one more level for the evaluator.
            self.nested()
            chained += 1
            node = Binary(op, node, lower())
        self.depth -= chained
        return node

    def shift(self) -> Node:
        return self.binary_level(("<<", ">>"), self.additive)

    def additive(self) -> Node:
        return self.binary_level(("+", "-"), self.term)

    def term(self) -> Node:
        return self.binary_level(("*", "/", "%"), self.unary)

    def unary(self) -> Node:
        if self.peek() in ("-", "+"):
            op = self.take()
            self.nested()
            node = Unary(op, self.unary())
            self.depth -= 1
            return node
        return self.primary()

    def primary(self) -> Node:
        token = self.take()
        if token == "(":
            self.nested()
            node = self.shift()
            self.depth -= 1
            self.take(")")
            return node
        if token[0].isdigit():
            return Num(_literal(token))
        if token[0].isalpha() or token[0] == "_":
            if self.peek() == "(":
                if token not in _FUNCS:
                    raise ExprError(f"unknown function {token!r} (known: {', '.join(sorted(_FUNCS))})")
                self.take("(")
                self.nested()
                args = [self.shift()]
                while self.peek() == ",":
                    self.take(",")
                    args.append(self.shift())
                self.depth -= 1
                self.take(")")
                if len(args) != _FUNCS[token]:
                    raise ExprError(f"{token}() takes {_FUNCS[token]} arguments, got {len(args)}")
                return Call(token, tuple(args))
            return Name(token)
        raise ExprError(f"unexpected {token!r} in {self.text!r}")


def parse(text: str | int) -> Node:
    """Parse an expression (an int is a literal). Raises :class:`ExprError`."""
    if isinstance(text, bool):
        raise ExprError("expected an integer or an expression, got a boolean")
    if isinstance(text, int):
        return Num(_checked(text))
    if not isinstance(text, str):
        raise ExprError(f"expected an integer or an expression string, got {type(text).__name__}")
    return _parse_text(text)


@functools.lru_cache(maxsize=4096)
def _parse_text(text: str) -> Node:
    # Cached: a spec's expressions are evaluated at every variant (nodes are frozen, so sharing is safe).
    return _Parser(text).parse()


def node_count(node: Node) -> int:
    """Nodes in ``node``: the steps one evaluation takes."""
    if isinstance(node, Unary):
        return 1 + node_count(node.operand)
    if isinstance(node, Binary):
        return 1 + node_count(node.left) + node_count(node.right)
    if isinstance(node, Call):
        return 1 + sum(node_count(a) for a in node.args)
    return 1


def names(node: Node) -> frozenset[str]:
    """Every variable name the expression reads."""
    if isinstance(node, Name):
        return frozenset((node.name,))
    if isinstance(node, Unary):
        return names(node.operand)
    if isinstance(node, Binary):
        return names(node.left) | names(node.right)
    if isinstance(node, Call):
        return frozenset().union(*(names(a) for a in node.args))
    return frozenset()


def _c_div(a: int, b: int) -> int:
    if b == 0:
        raise ExprError("division by zero")
    quotient = abs(a) // abs(b)
    return quotient if (a >= 0) == (b >= 0) else -quotient


def _c_mod(a: int, b: int) -> int:
    return a - b * _c_div(a, b)


def _shift(a: int, b: int, left: bool) -> int:
    if b < 0:
        raise ExprError(f"negative shift count {b}")
    if not left:
        return a >> b
    if a != 0 and a.bit_length() + b > MAX_ABS.bit_length():
        raise ExprError(f"value out of range: {a} << {b} exceeds 2^64")
    return a << b


def evaluate(node: Node | str | int, env: Mapping[str, int]) -> int:
    """Evaluate ``node`` (or the text of an expression) with the integer values in ``env``.

    Raises :class:`ExprError`, also when a value leaves ±2^64 (:data:`MAX_ABS`).
    """
    if not isinstance(node, (Num, Name, Unary, Binary, Call)):
        node = parse(node)
    return _checked(_evaluate(node, env))


def _evaluate(node: Node, env: Mapping[str, int]) -> int:
    if isinstance(node, Num):
        return node.value
    if isinstance(node, Name):
        if node.name not in env:
            raise ExprError(f"unknown name {node.name!r}")
        value = env[node.name]
        if isinstance(value, bool) or not isinstance(value, int):
            raise ExprError(f"{node.name!r} is not an integer")
        return _checked(value)
    if isinstance(node, Unary):
        value = evaluate(node.operand, env)
        return -value if node.op == "-" else value
    if isinstance(node, Call):
        a, b = (evaluate(arg, env) for arg in node.args)
        if node.func == "min":
            return min(a, b)
        if node.func == "max":
            return max(a, b)
        if b == 0:
            raise ExprError("ceil_div by zero")
        return -((-a) // b)
    a, b = evaluate(node.left, env), evaluate(node.right, env)
    match node.op:
        case "+":
            return a + b
        case "-":
            return a - b
        case "*":
            return a * b
        case "/":
            return _c_div(a, b)
        case "%":
            if b == 0:
                raise ExprError("modulo by zero")
            return _c_mod(a, b)
        case "<<":
            return _shift(a, b, True)
        case ">>":
            return _shift(a, b, False)
    raise ExprError(f"unknown operator {node.op!r}")
