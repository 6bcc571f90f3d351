"""Integer polynomials over named symbols: the symbolic values of the access analysis.

A :class:`Poly` is a sum of monomials with integer coefficients. Symbols are the CUDA builtins
(``tid.x``, ``bid.y``, ``bdim.x``, ``gdim.z``), scalar kernel parameters (by name), loop
iteration counters (``it@L3``) and opaque terms (``?7``: a sub-expression the analysis does not
model, such as a load or a division by a variable; never guessed). Index arithmetic in real
kernels is polynomial (``(blockIdx.x*blockDim.x + threadIdx.x) * n + k``), so this covers it
exactly and leaves the rest visible as opaque terms.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

Monomial = tuple[str, ...]
"""Sorted symbol names, repeated for powers; ``()`` is the constant term."""

def is_opaque(symbol: str) -> bool:
    return symbol.startswith("?")


def is_iteration(symbol: str) -> bool:
    return symbol.startswith("it@")


@dataclass(frozen=True)
class Poly:
    terms: tuple[tuple[Monomial, int], ...] = ()
    """(monomial, coefficient) pairs, sorted by monomial, no zero coefficients."""

    @staticmethod
    def const(value: int) -> Poly:
        return Poly((((), value),)) if value else ZERO

    @staticmethod
    def sym(name: str) -> Poly:
        return Poly((((name,), 1),))

    @staticmethod
    def _from(acc: Mapping[Monomial, int]) -> Poly:
        return Poly(tuple(sorted((m, c) for m, c in acc.items() if c)))

    def __add__(self, other: Poly) -> Poly:
        acc = dict(self.terms)
        for m, c in other.terms:
            acc[m] = acc.get(m, 0) + c
        return Poly._from(acc)

    def __neg__(self) -> Poly:
        return Poly(tuple((m, -c) for m, c in self.terms))

    def __sub__(self, other: Poly) -> Poly:
        return self + (-other)

    def __mul__(self, other: Poly) -> Poly:
        acc: dict[Monomial, int] = {}
        for m1, c1 in self.terms:
            for m2, c2 in other.terms:
                m = tuple(sorted(m1 + m2))
                acc[m] = acc.get(m, 0) + c1 * c2
        return Poly._from(acc)

    def scale(self, k: int) -> Poly:
        return Poly._from({m: c * k for m, c in self.terms})

    def exact_div(self, k: int) -> Poly | None:
        """``self / k`` when every coefficient is a multiple of ``k`` (C truncation is then exact)."""
        if k == 0 or any(c % k for _, c in self.terms):
            return None
        return Poly(tuple((m, c // k) for m, c in self.terms))

    @property
    def constant(self) -> int | None:
        """The value when the polynomial has no symbols, else None."""
        if not self.terms:
            return 0
        if len(self.terms) == 1 and self.terms[0][0] == ():
            return self.terms[0][1]
        return None

    @property
    def symbols(self) -> frozenset[str]:
        return frozenset(s for m, _ in self.terms for s in m)

    def degree_in(self, symbol: str) -> int:
        return max((m.count(symbol) for m, _ in self.terms), default=0)

    def coefficient(self, symbol: str) -> Poly | None:
        """d self / d symbol when ``self`` is linear in it (else None): the stride along it."""
        if self.degree_in(symbol) > 1:
            return None
        acc: dict[Monomial, int] = {}
        for m, c in self.terms:
            if symbol in m:
                rest = list(m)
                rest.remove(symbol)
                acc[tuple(rest)] = acc.get(tuple(rest), 0) + c
        return Poly._from(acc)

    def renamed(self, old: str, new: str) -> Poly:
        """The polynomial with the symbol ``old`` written ``new``."""
        acc: dict[Monomial, int] = {}
        for m, c in self.terms:
            key = tuple(sorted(new if s == old else s for s in m))
            acc[key] = acc.get(key, 0) + c
        return Poly._from(acc)

    def evaluate(self, env: Mapping[str, int]) -> int | None:
        """The value with every symbol bound by ``env``; None when one is missing."""
        total = 0
        for m, c in self.terms:
            value = c
            for s in m:
                bound = env.get(s)
                if bound is None:
                    return None
                value *= bound
            total += value
        return total

    def __str__(self) -> str:
        if not self.terms:
            return "0"
        parts: list[str] = []
        for m, c in sorted(self.terms, key=lambda t: (-len(t[0]), t[0])):
            names = "*".join(_show(s) for s in m)
            if not names:
                text = str(abs(c))
            elif abs(c) == 1:
                text = names
            else:
                text = f"{abs(c)}*{names}"
            parts.append(("- " if c < 0 else "+ ") + text)
        out = " ".join(parts)
        return out[2:] if out.startswith("+ ") else "-" + out[2:]


ZERO = Poly()
ONE = Poly.const(1)


def _show(symbol: str) -> str:
    if is_iteration(symbol):
        return symbol.split("@", 1)[1].split(":", 1)[-1]
    return symbol
