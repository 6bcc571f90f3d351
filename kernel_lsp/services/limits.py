"""How much memory the machine and its GPU have, for checks made before anything is allocated.

A launch spec's array sizes are checked against these (:func:`kernel_lsp.core.spec.memory_problem`)
so that a spec asking for 10 GB arrays is refused with a message instead of failing, or swapping,
inside the harness. Unknown (no ``nvidia-smi``, an odd platform) is None: the check is then skipped.
"""

from __future__ import annotations

import functools
import os

from kernel_lsp.core.spec import Spec, memory_problem
from kernel_lsp.services import proc


@functools.lru_cache(maxsize=1)
def device_memory_bytes() -> int | None:
    """Total memory of GPU 0 as ``nvidia-smi`` reports it, or None without one."""
    try:
        result = proc.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"], timeout_s=10)
    except proc.ToolMissing:
        return None
    if not result.ok:
        return None
    first = result.stdout.strip().splitlines()[:1]
    try:
        return int(first[0].strip()) * 2**20 if first else None  # reported in MiB
    except ValueError:
        return None


def host_memory_bytes() -> int | None:
    """Physical memory of this machine, or None where the platform does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def spec_memory_problem(spec: Spec) -> str | None:
    """Why ``spec``'s arrays cannot fit on the GPU or in this machine's memory, or None when they can."""
    for limit, what in ((device_memory_bytes(), "the GPU's memory"), (host_memory_bytes(), "this machine's memory")):
        if limit is not None:
            problem = memory_problem(spec, limit, what)
            if problem:
                return problem
    return None
