"""What a rewrite rule is: a context in, preconditions checked, rewrites out.

A rule is a pure function of (source, index, kernel, spec): it never compiles,
runs or reads files. ``preconditions`` says whether the pattern is *proven* in
the code (and, where the rewrite's correctness depends on sizes or launch
shapes, in the launch spec), with a reason either way; ``apply`` is only called
when it holds and returns one or more :class:`Rewrite`\\ s. The harness still
verifies every rewrite: a precondition is what keeps a rule from proposing
something it cannot justify, not a substitute for verification.
"""

from __future__ import annotations

import abc

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from kernel_lsp.core.analysis import KernelFacts, analyze
from kernel_lsp.core.index import Function, KernelIndex
from kernel_lsp.core.source import Preprocessed, preprocess
from kernel_lsp.core.spec import ArrayParam, Launch, Spec, SpecError, with_candidate_launch

#: Most threads per block on every CUDA GPU since compute capability 2.0.
MAX_THREADS_PER_BLOCK = 1024
#: Largest gridDim.y / gridDim.z.
MAX_GRID_YZ = 65535


@dataclass(frozen=True)
class Rewrite:
    source: str
    """The whole rewritten file."""
    description: str
    launch_override: Mapping[str, Any] | None = None
    """The spec's ``candidate`` field (grid/block/dynamic_smem expressions) for this rewrite, or None: original launch."""
    variant: str = ""
    grid_scale: tuple[int, int, int] | None = None
    block: tuple[int, int, int] | None = None
    """The block the host launches instead, with the grid grown to keep the threads per axis (smaller blocks)."""
    """The launch change in the host's terms: blocks per axis relative to the original grid."""
    """Tells several rewrites of one rule apart (``block=512``)."""
    grid_divide: tuple[int, int, int] | None = None
    """Original blocks one new block serves per axis (a column group: ``(32, 1, 1)``): the host's grid is
    divided by it, rounded up, and ``block`` replaces its block as given (not reshaped)."""


class RuleContext:
    """Everything a rule may look at, with the derived views computed once."""

    def __init__(self, source: str, index: KernelIndex, kernel: Function, spec: Spec | None,
                 preprocessed: Preprocessed | None = None):
        self.source = source
        self.source_bytes = source.encode("utf-8")
        self.index = index
        self.kernel = kernel
        self.spec = spec
        self._preprocessed = preprocessed

    @cached_property
    def preprocessed(self) -> Preprocessed:
        return self._preprocessed if self._preprocessed is not None else preprocess(self.source)

    @cached_property
    def facts(self) -> KernelFacts | None:
        """The kernel's access analysis on the preprocessed view (macro bodies and helpers seen);
        None when the kernel is not found there."""
        return analyze(self.preprocessed).get(self.kernel.name)

    @cached_property
    def read_only(self) -> set[str]:
        """Pointer parameters the kernel provably never writes, through macros, aliases and helpers."""
        facts = self.facts
        return set(facts.read_only) if facts is not None else set()

    def spec_scalar(self, name: str) -> bool:
        """``name`` is an integer scalar of the spec (so launch expressions may use it)."""
        return self.spec is not None and any(p.name == name and p.type.startswith(("int", "uint")) for p in self.spec.scalars)

    def launches(self) -> list[Launch]:
        """The original launch at the main size and at every variant (empty without a spec)."""
        if self.spec is None:
            return []
        try:
            return [self.spec.resolve(v).original for v in [None, *range(len(self.spec.variants))]]
        except (SpecError, ValueError, ZeroDivisionError):
            return []

    def constant_block(self) -> tuple[int, int, int] | None:
        """The original block shape when the spec fixes it at every size."""
        shapes = {launch.block for launch in self.launches()}
        return next(iter(shapes)) if len(shapes) == 1 else None

    def launch_ok(self, override: Mapping[str, Any]) -> bool:
        """The launch ``override`` (a spec ``candidate`` field) parses and evaluates at every size of the
        spec, so the harness can use it."""
        if self.spec is None:
            return False
        try:
            with_candidate_launch(self.spec, override)
        except (SpecError, ValueError, ZeroDivisionError):
            return False
        return True

    def distinct_arrays(self) -> bool:
        """Every pointer parameter is its own array in the spec (separate allocations: no aliasing)."""
        if self.spec is None:
            return False
        arrays = {p.name for p in self.spec.params if isinstance(p, ArrayParam)}
        # The analysis sees through typedef'd pointers (``Data_ptr p``); the index reads the declarator.
        facts = self.facts
        if facts is not None and len(facts.params) == len(self.kernel.params):
            pointers = [i for i, (_, _, is_pointer) in enumerate(facts.params) if is_pointer]
        else:
            pointers = [i for i, p in enumerate(self.kernel.params) if p.pointer_depth > 0]
        if len(self.spec.params) != len(self.kernel.params):
            return False
        return all(self.spec.params[i].name in arrays for i in pointers)


class Rule(abc.ABC):
    """Base class: subclasses set ``name``, ``technique`` and implement ``check`` and ``rewrite``."""

    name: str = ""
    technique: str = ""
    """The knowledge base's technique name (kernel_lsp/data/techniques.json)."""
    summary: str = ""

    def preconditions(self, ctx: RuleContext) -> tuple[bool, str]:
        if ctx.kernel.body_span is None:
            return False, "the kernel has no body in this file"
        if ctx.index.syntax_errors:
            return False, "the file has syntax errors"
        try:
            return self.check(ctx)
        except (ValueError, KeyError, IndexError) as exc:
            return False, f"could not analyse the kernel: {exc}"

    @abc.abstractmethod
    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        """(applies, why): what the rule proved about the kernel, or why it refuses."""

    def apply(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        ok, why = self.preconditions(ctx)
        if not ok:
            raise ValueError(f"{self.name}: preconditions not met: {why}")
        return tuple(r for r in self.rewrite(ctx) if r.source != ctx.source or r.launch_override)

    @abc.abstractmethod
    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        """The rewritten sources; called only after ``check`` accepted the kernel."""
