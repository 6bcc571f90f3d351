"""nvcc on a transformation's candidate, for the transformation tests."""

from __future__ import annotations

from pathlib import Path


def compiles(source: str, folder: str | Path, include: str | Path | None = None) -> None:
    """``nvcc -arch=sm_90 -cubin`` on the candidate, in ``folder``; ``include``: the corpus kernel's folder,
    where its relative includes (``../_common/…``) resolve."""
    from kernel_lsp.services.harness.compile import compile_cubin
    from kernel_lsp.services.toolchain import BuildFlags

    Path(folder).mkdir(parents=True, exist_ok=True)
    flags = BuildFlags(flags=("-I", str(include)) if include else ()).for_arch("sm_90")
    result = compile_cubin(source, str(folder), "cand", flags)
    assert result.ok, result.log
