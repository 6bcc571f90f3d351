"""nvcc on a transformation's candidate, for the transformation tests."""

from __future__ import annotations

import shutil
from pathlib import Path


def compiles(source: str, tmp_path: Path, beside: Path | None = None) -> None:
    """nvcc on the candidate; ``beside``: the corpus kernel's folder, whose relative includes it keeps."""
    from kernel_lsp.services.harness.compile import compile_cubin
    from kernel_lsp.services.toolchain import BuildFlags

    work = tmp_path / "k"
    work.mkdir()
    if beside is not None and (beside.parent / "_common").is_dir():
        shutil.copytree(beside.parent / "_common", tmp_path / "_common")
    result = compile_cubin(source, str(work), "cand", BuildFlags().for_arch("sm_90"))
    assert result.ok, result.log
