"""The whole optimization loop on the GPU: rules -> harness -> knowledge base -> best rewrite.

Skipped cleanly without pycuda, nvcc or a CUDA device (tests/gpu/conftest.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kernel_lsp import cli
from kernel_lsp.services.harness import VerifyOptions, load_spec_file
from kernel_lsp.services.kb import KnowledgeBase
from kernel_lsp.services.optimizer import Budget, harness_verifier, optimize

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


pytestmark = pytest.mark.gpu


def test_transpose_loop_finds_the_tiled_rewrite_and_teaches_the_kb(tmp_path: Path) -> None:
    source = (EXAMPLES / "transpose" / "original.cu").read_text()
    spec = load_spec_file(EXAMPLES / "transpose" / "spec.json")
    with KnowledgeBase.open(tmp_path / "kb.sqlite3") as kb:
        result = optimize(source, "transpose.cu", spec.kernel, spec, verifier=harness_verifier(VerifyOptions()), kb=kb,
                          budget=Budget(max_candidates=8, max_seconds=900))
        attempts = kb.attempts()
    assert result.gpu_error is None
    best = result.best
    assert best is not None, [r.to_json() for r in result.results]
    assert best.candidate.technique == "transpose-via-shared-memory"
    assert best.verdict.speedup_ci_low >= 1.5
    assert len(attempts) == len(result.results)
    assert any(a.accepted and a.technique == "transpose-via-shared-memory" for a in attempts)


def test_cli_writes_the_best_verified_rewrite(tmp_path: Path, capsys) -> None:
    for name in ("original.cu", "spec.json"):
        shutil.copy(EXAMPLES / "histogram" / name, tmp_path / name)
    code = cli.main(["optimize", str(tmp_path / "original.cu"), "--spec", str(tmp_path / "spec.json"),
                     "--kb", str(tmp_path / "kb.sqlite3"), "--budget", "3", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0, data
    # shared-privatize keeps the bins in shared memory; the file holds the best verified candidate.
    best = next(c for c in data["candidates"] if c["candidate_hash"] == data["best"])
    assert best["verdict"]["accepted"] and best["verdict"]["speedup_ci_low"] >= 1.5, best
    assert data["written"] and "__shared__" in Path(data["written"]).read_text()
    assert (tmp_path / "original.cu").read_text() == (EXAMPLES / "histogram" / "original.cu").read_text()
