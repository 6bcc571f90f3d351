"""Evaluate small integer constant expressions from CUDA source text.

Used for ``__shared__`` array sizes, literal loop trip counts and launch block
sizes. Handles integer literals (decimal, hex, octal, binary, with u/l
suffixes), names bound in a constants table (``#define``, ``const int``,
``constexpr``; resolved recursively), ``+ - * / % << >> & | ^ ~``, unary
minus, parentheses, ``sizeof(type)`` for known scalar types, and casts to
integer types. Anything else gives None: never a guess.

Work is bounded (the text is a workspace's, evaluated in the editor): each
constant is evaluated once per call (``#define A B*B`` chains cost linear, not
exponential, time), one call reads at most :data:`MAX_TOKENS` tokens, and a
value beyond ±2^64 makes the result unknown.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

#: Byte sizes of CUDA scalar and vector types, for ``sizeof`` and shared-memory sizes.
TYPE_SIZES_BYTES: dict[str, int] = {
    "char": 1, "signed char": 1, "unsigned char": 1, "int8_t": 1, "uint8_t": 1, "bool": 1,
    "short": 2, "unsigned short": 2, "int16_t": 2, "uint16_t": 2,
    "half": 2, "__half": 2, "__nv_bfloat16": 2, "nv_bfloat16": 2,
    "int": 4, "unsigned": 4, "unsigned int": 4, "int32_t": 4, "uint32_t": 4, "float": 4,
    "__half2": 4, "half2": 4, "__nv_bfloat162": 4, "nv_bfloat162": 4,
    "long": 8, "unsigned long": 8, "long long": 8, "unsigned long long": 8, "int64_t": 8,
    "uint64_t": 8, "size_t": 8, "double": 8, "long int": 8, "long long int": 8,
    "char2": 2, "uchar2": 2, "char4": 4, "uchar4": 4, "short2": 4, "ushort2": 4, "short4": 8,
    "ushort4": 8, "int2": 8, "uint2": 8, "int3": 12, "uint3": 12, "int4": 16, "uint4": 16,
    "float2": 8, "float3": 12, "float4": 16, "double2": 16, "double3": 24, "double4": 32,
    "long2": 16, "longlong2": 16, "ulonglong2": 16,
}

_TOKEN = re.compile(
    r"\s*(?:(?P<num>0[xX][0-9a-fA-F']+|0[bB][01']+|\d[\d']*)(?P<suffix>[uUlL]*)(?![\w.])"
    r"|(?P<name>[A-Za-z_]\w*(?:\s*::\s*[A-Za-z_]\w*)*)"
    r"|(?P<op><<|>>|[-+*/%()&|^~]))"
)
_MAX_DEPTH = 16
#: Most tokens one :func:`evaluate_int` call reads, constants' definitions included.
MAX_TOKENS = 10_000
_MAX_ABS = 2**64
_INT_CASTS = {"int", "unsigned", "unsigned int", "long", "size_t", "long long", "unsigned long long",
              "int32_t", "uint32_t", "int64_t", "uint64_t", "short", "unsigned long"}


class _Unknown(Exception):
    """Raised inside the evaluator when the expression is not a known constant."""


def _tokenize(text: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise _Unknown(text[pos:])
        pos = m.end()
        if m.group("num") is not None:
            digits = m.group("num").replace("'", "")
            if digits.lower().startswith("0x"):
                value = int(digits, 16)
            elif digits.lower().startswith("0b"):
                value = int(digits[2:], 2)
            elif len(digits) > 1 and digits.startswith("0"):
                value = int(digits, 8)
            else:
                value = int(digits)
            tokens.append(("num", str(value)))
        elif m.group("name") is not None:
            tokens.append(("name", re.sub(r"\s+", "", m.group("name"))))
        else:
            tokens.append(("op", m.group("op")))
    return tokens


class _Budget:
    """What one evaluation shares across constants: tokens left and the constants already evaluated."""

    def __init__(self) -> None:
        self.tokens_left = MAX_TOKENS
        self.values: dict[str, int | None] = {}


class _Parser:
    def __init__(self, tokens: list[tuple[str, str]], constants: Mapping[str, str], depth: int, budget: _Budget) -> None:
        budget.tokens_left -= len(tokens)
        if budget.tokens_left < 0:
            raise _Unknown("too much work")
        self.tokens = tokens
        self.pos = 0
        self.constants = constants
        self.depth = depth
        self.budget = budget

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        tok = self.peek()
        if tok is None:
            raise _Unknown("end")
        self.pos += 1
        return tok

    def expect(self, op: str) -> None:
        if self.take() != ("op", op):
            raise _Unknown(op)

    def parse(self) -> int:
        value = self.binary(0)
        if self.peek() is not None:
            raise _Unknown("trailing")
        return value

    _LEVELS: tuple[tuple[str, ...], ...] = (("|",), ("^",), ("&",), ("<<", ">>"), ("+", "-"), ("*", "/", "%"))

    def binary(self, level: int) -> int:
        if level == len(self._LEVELS):
            return self.unary()
        left = self.binary(level + 1)
        while (tok := self.peek()) is not None and tok[0] == "op" and tok[1] in self._LEVELS[level]:
            self.pos += 1
            right = self.binary(level + 1)
            left = _apply(tok[1], left, right)
            if not -_MAX_ABS <= left <= _MAX_ABS:
                raise _Unknown("out of range")
        return left

    def unary(self) -> int:
        tok = self.take()
        if tok == ("op", "-"):
            return -self.unary()
        if tok == ("op", "+"):
            return self.unary()
        if tok == ("op", "~"):
            return ~self.unary()
        if tok == ("op", "("):
            cast = self._try_cast()
            if cast is not None:
                return cast
            value = self.binary(0)
            self.expect(")")
            return value
        if tok[0] == "num":
            return int(tok[1])
        name = tok[1]
        if name == "sizeof":
            return self._sizeof()
        if name in _INT_CASTS and self.peek() == ("op", "("):
            self.take()
            value = self.binary(0)
            self.expect(")")
            return value
        return self._constant(name)

    def _try_cast(self) -> int | None:
        """``(int)expr``: a parenthesised integer type name followed by an operand."""
        save = self.pos
        words = []
        while (tok := self.peek()) is not None and tok[0] == "name":
            words.append(tok[1])
            self.pos += 1
        if words and " ".join(words) in _INT_CASTS and self.peek() == ("op", ")"):
            self.pos += 1
            return self.unary()
        self.pos = save
        return None

    def _sizeof(self) -> int:
        self.expect("(")
        words = []
        while (tok := self.take()) != ("op", ")"):
            if tok[0] != "name":
                raise _Unknown("sizeof")
            words.append(tok[1])
        size = TYPE_SIZES_BYTES.get(" ".join(words))
        if size is None:
            raise _Unknown("sizeof")
        return size

    def _constant(self, name: str) -> int:
        short = name.rsplit("::", 1)[-1]
        text = self.constants.get(name, self.constants.get(short))
        if text is None or self.depth >= _MAX_DEPTH:
            raise _Unknown(name)
        if name in self.budget.values:
            value = self.budget.values[name]
        else:
            value = _evaluate(text, self.constants, self.depth + 1, self.budget)
            self.budget.values[name] = value
        if value is None:
            raise _Unknown(name)
        return value


def _apply(op: str, left: int, right: int) -> int:
    if op in ("/", "%") and right == 0:
        raise _Unknown("division by zero")
    if op in ("<<", ">>") and not 0 <= right < 64:
        raise _Unknown("shift")
    if op == "/":
        # C truncates toward zero.
        quotient = abs(left) // abs(right)
        return quotient if (left >= 0) == (right >= 0) else -quotient
    if op == "%":
        return left - right * _apply("/", left, right)
    # One operation at a time: a table of every result would compute ``left << right`` for a product too.
    match op:
        case "+":
            return left + right
        case "-":
            return left - right
        case "*":
            return left * right
        case "<<":
            return left << right
        case ">>":
            return left >> right
        case "&":
            return left & right
        case "|":
            return left | right
    return left ^ right


def _evaluate(text: str, constants: Mapping[str, str], depth: int, budget: _Budget) -> int | None:
    try:
        value = _Parser(_tokenize(text), constants, depth, budget).parse()
    except (_Unknown, RecursionError, ValueError):
        return None
    return value if -_MAX_ABS <= value <= _MAX_ABS else None


def evaluate_int(text: str, constants: Mapping[str, str] | None = None) -> int | None:
    """The integer value of ``text`` or None when it is not a known constant.

    ``constants`` maps names to their defining expression text (``{"BLOCK": "256"}``).
    """
    if len(text) > 1000:
        return None
    if text.isdigit():
        value = int(text, 8) if len(text) > 1 and text.startswith("0") else int(text)
        return value if value <= _MAX_ABS else None
    return _evaluate(text, constants or {}, 0, _Budget())
