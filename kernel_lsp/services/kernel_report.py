"""What is known about each kernel: ptxas resources joined with occupancy per launch.

Shared by the server (hover, code lens, inlay hints) and ``kernel-lsp check``,
so both say the same thing. Pure apart from its inputs: no IO here, it only
combines the index, the preprocessed view (:meth:`kernel_lsp.services.session.Session.preprocessed`),
a :class:`~kernel_lsp.services.toolchain.CompileResult` and the core's occupancy model. Unknown values stay None; nothing is guessed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kernel_lsp.core.index import Function, KernelIndex, LaunchSite
from kernel_lsp.core.launch_dims import evaluate_launch
from kernel_lsp.core.nvcc_output import ResourceUsage
from kernel_lsp.core.occupancy import Occupancy, theoretical_occupancy
from kernel_lsp.core.source import Preprocessed
from kernel_lsp.services.toolchain import CompileResult


@dataclass(frozen=True)
class LaunchFacts:
    launch: LaunchSite
    block_threads: int | None
    """Threads per block when the block expression evaluates to a constant."""
    dynamic_shared_bytes: int | None
    """The launch's dynamic shared memory (0 when not given), None when not a constant."""
    occupancy: Occupancy | None
    """Theoretical occupancy; None unless block size and registers are known (and the arch is)."""


@dataclass(frozen=True)
class KernelFacts:
    function: Function
    resources: ResourceUsage | None
    """From the last compile; None before one succeeded."""
    launches: tuple[LaunchFacts, ...]

    @property
    def first_occupancy(self) -> LaunchFacts | None:
        return next((f for f in self.launches if f.occupancy is not None), None)


def launch_facts(
    index: KernelIndex, source: bytes, launch: LaunchSite, resources: ResourceUsage | None, arch: str,
    defines: Mapping[str, str] | None = None, pre: Preprocessed | None = None,
) -> LaunchFacts:
    """``defines``: the compile's ``-D`` macros, so ``<<<grid, BLOCK>>>`` with ``-DBLOCK=256`` is known;
    ``pre``: the file's preprocessed view, so ``BLOCK_SIZE`` from a local header is too."""
    dims = evaluate_launch(launch, source, index, defines, pre)
    threads, dynamic = dims.block_threads, dims.dynamic_shared_bytes
    occupancy = None
    if threads is not None and resources is not None and resources.registers_per_thread is not None and dynamic is not None:
        static = resources.shared_bytes_static or 0
        occupancy = theoretical_occupancy(arch, threads, resources.registers_per_thread, static + dynamic)
    return LaunchFacts(launch, threads, dynamic, occupancy)


def kernel_facts(
    index: KernelIndex,
    source: bytes,
    function: Function,
    compile: CompileResult | None,
    arch: str,
    launches: tuple[LaunchSite, ...] | None = None,
    pre: Preprocessed | None = None,
) -> KernelFacts:
    """Facts of one kernel; ``launches`` (its launch sites) may be passed when the caller has them indexed."""
    resources = compile.resources_for(function.name) if compile is not None else None
    defines = compile.defines if compile is not None else None
    sites = index.launches_of(function.name) if launches is None else launches
    launches_facts = tuple(launch_facts(index, source, launch, resources, arch, defines, pre) for launch in sites)
    return KernelFacts(function, resources, launches_facts)


def group_launches(index: KernelIndex) -> dict[str, tuple[LaunchSite, ...]]:
    """Launch sites by unqualified kernel name (what :meth:`KernelIndex.launches_of` matches), in one pass."""
    groups: dict[str, list[LaunchSite]] = {}
    for launch in index.launches:
        groups.setdefault(launch.kernel.rsplit("::", 1)[-1], []).append(launch)
    return {name: tuple(sites) for name, sites in groups.items()}


def report(
    index: KernelIndex,
    source: bytes,
    compile: CompileResult | None,
    arch: str,
    groups: dict[str, tuple[LaunchSite, ...]] | None = None,
    pre: Preprocessed | None = None,
) -> tuple[KernelFacts, ...]:
    """Facts for every kernel of the file, in source order."""
    groups = group_launches(index) if groups is None else groups
    return tuple(kernel_facts(index, source, fn, compile, arch, groups.get(fn.name, ()), pre) for fn in index.kernels)
