"""The interface every candidate generator (rewrite rules, a local model) implements.

A generator proposes whole-file rewrites of one kernel; it never decides whether
a candidate is good: only the verification harness does.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class TechniqueHint:
    """A technique the knowledge base suggests for the kernel's performance state."""

    name: str
    description: str
    predicted_speedup: float
    confidence: float
    example_before: str | None = None
    example_after: str | None = None


@dataclass(frozen=True)
class OptimizeRequest:
    source: str
    """The whole file as the user has it."""
    path: str
    kernel: str
    spec: Mapping[str, Any] | None
    """The kernel's launch spec (v1 JSON as a dict), if any."""
    profile_summary: str | None = None
    """A short text summary of the kernel's last profile."""
    state: str | None = None
    """The knowledge base's performance state for this kernel."""
    techniques: tuple[TechniqueHint, ...] = ()
    """Techniques in the order the knowledge base picked them."""


@dataclass(frozen=True)
class Candidate:
    kernel: str
    source: str
    """The whole candidate file."""
    technique: str
    generator: str
    """``rule:<name>`` or ``model:<name>``."""
    description: str
    launch_override: Mapping[str, Any] | None = None
    """The spec's ``candidate`` field (grid/block/dynamic_smem) when the rewrite needs another launch."""
    trace: tuple[Mapping[str, Any], ...] = field(default=(), compare=False)
    """Model tool calls and messages that produced it (empty for rules)."""
    grid_scale: tuple[int, int, int] | None = None
    """Blocks per axis the host must launch relative to the original (a warp per row: (32, 1, 1)); the
    launch sites in the file are edited to match (:mod:`kernel_lsp.core.transforms.launch_edit`)."""
    block: tuple[int, int, int] | None = None
    """The block the host must launch instead, the threads per axis kept (the grid grows to match);
    the launch sites are edited to match like ``grid_scale``."""
    grid_divide: tuple[int, int, int] | None = None
    """Original blocks one new block serves per axis: the host's grid is divided by it (rounded up) and its
    block becomes ``block`` as given; the launch sites are edited to match like ``grid_scale``."""
    after: str | None = None
    """The ``generator`` of the candidate this one extends (a sequence of transformations): it is
    tried only once that one was accepted, so every intermediate step is verified."""
    after_correct: bool = False
    """Tried once the candidate it extends verified correct, faster or not: that step only makes this one
    possible (an element kept in a register takes the store out of a loop that a load batch then runs ahead,
    or out of the row loop that a warp per row then splits)."""


class CandidateGenerator(Protocol):
    name: str

    def generate(self, request: OptimizeRequest) -> Iterator[Candidate]:
        """Yield candidates, best first; stop when the generator has no more ideas."""
        ...
