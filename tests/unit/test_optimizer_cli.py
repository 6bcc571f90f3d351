"""``kernel-lsp optimize``: dry runs list unverified candidates, the best verified rewrite goes to a
new file, the input changes only with --apply, and no GPU is a clear failure."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from kernel_lsp import cli
from kernel_lsp.core.verdict import Reason, Verdict
from kernel_lsp.services import optimizer

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
HAS_GPU_STACK = importlib.util.find_spec("pycuda") is not None


@pytest.fixture
def example(tmp_path: Path) -> Path:
    for name in ("original.cu", "spec.json"):
        shutil.copy(EXAMPLES / "transpose" / name, tmp_path / name)
    return tmp_path


def _run(example: Path, *extra: str) -> int:
    return cli.main(["optimize", str(example / "original.cu"), "--spec", str(example / "spec.json"),
                     "--kb", str(example / "kb.sqlite3"), *extra])


def test_dry_run_lists_unverified_candidates_and_writes_nothing(example: Path, capsys) -> None:
    before = (example / "original.cu").read_text()
    assert _run(example, "--dry-run", "--explain", "--budget", "20") == 0
    out = capsys.readouterr().out
    assert "transpose-via-shared-memory (rule:shared-tile-transpose)" in out
    assert "UNVERIFIED" in out and "nothing was written or applied" in out
    assert "rule pragma-unroll: refused: no loop with a known trip count" in out
    assert (example / "original.cu").read_text() == before
    assert not (example / "original.optimized.cu").exists()


def test_dry_run_json_and_saved_candidates(example: Path, capsys) -> None:
    assert _run(example, "--no-verify", "--json", "--budget", "20", "--save-candidates", str(example / "cands")) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["dry_run"] is True and data["best"] is None
    assert all(c["status"] == "unverified" for c in data["candidates"])
    saved = json.loads((example / "cands" / "candidates.json").read_text())
    assert len(saved["candidates"]) == len(data["candidates"])
    tiled = next(c for c in saved["candidates"] if c["technique"] == "transpose-via-shared-memory")
    assert "kl_tile" in (example / "cands" / tiled["file"]).read_text()
    assert tiled["launch_override"]["block"] == [32, 8, 1]


@pytest.mark.skipif(HAS_GPU_STACK, reason="checks the no-GPU path")
def test_without_a_gpu_nothing_is_written(example: Path, capsys) -> None:
    before = (example / "original.cu").read_text()
    assert _run(example, "--budget", "2", "--apply") == cli.EXIT_NO_GPU
    out = capsys.readouterr().out
    assert "nothing verified: no GPU" in out
    assert (example / "original.cu").read_text() == before
    assert not (example / "original.optimized.cu").exists()


def _scripted(monkeypatch) -> None:
    def verifier_factory(options=None):
        def verify(original, candidate, spec, cancel):
            if "kl_tile" in candidate:
                return Verdict(True, Reason.OK, speedup=2.3, speedup_ci_low=2.2, speedup_ci_high=2.4, max_rel_error=0.0)
            return Verdict(False, Reason.NOT_FASTER, ("scripted",), speedup=1.0, speedup_ci_low=0.9, speedup_ci_high=1.1)
        return verify

    monkeypatch.setattr(optimizer, "harness_verifier", verifier_factory)


def test_best_goes_to_a_new_file_with_its_launch(example: Path, monkeypatch, capsys) -> None:
    _scripted(monkeypatch)
    before = (example / "original.cu").read_text()
    assert _run(example, "--budget", "20") == 0
    out = capsys.readouterr().out
    assert "ACCEPTED 2.30x" in out and "written to" in out
    written = (example / "original.optimized.cu").read_text()
    assert "kl_tile" in written
    launch = json.loads((example / "original.optimized.cu.launch.json").read_text())
    assert launch["candidate"]["block"] == [32, 8, 1]
    assert (example / "original.cu").read_text() == before


def test_apply_rewrites_the_input(example: Path, monkeypatch) -> None:
    _scripted(monkeypatch)
    assert _run(example, "--budget", "20", "--apply") == 0
    assert "kl_tile" in (example / "original.cu").read_text()


def test_apply_keeps_the_files_crlf_line_endings(example: Path, monkeypatch) -> None:
    """A file checked out with CRLF endings: the rewrite is written with CRLF too, not every line of
    the file changed to LF."""
    _scripted(monkeypatch)
    original = example / "original.cu"
    original.write_bytes(original.read_bytes().replace(b"\r\n", b"\n").replace(b"\n", b"\r\n"))
    assert _run(example, "--budget", "20", "--apply") == 0
    written = original.read_bytes()
    assert b"kl_tile" in written
    assert written.count(b"\n") == written.count(b"\r\n") > 10


def test_bad_usage(example: Path, capsys) -> None:
    assert cli.main(["optimize", str(example / "missing.cu")]) == 2
    assert cli.main(["optimize", str(example / "original.cu")]) == 2  # no spec anywhere
    assert "no single sidecar or in-source spec" in capsys.readouterr().err
    assert _run(example, "--kernel", "other") == 2


def test_explain_judges_on_the_view_with_the_files_headers(tmp_path: Path, capsys) -> None:
    """A size from a local header (``#define N`` in ``sizes.h``): the search saw it, and so must the
    rule verdicts --explain prints (they were judged on the file alone, and contradicted the list)."""
    (tmp_path / "sizes.h").write_text("#define N 1024\n")
    (tmp_path / "k.cu").write_text('#include "sizes.h"\n__global__ void k(const float* a, float* y) {\n'
                                   "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n  if (i < N) {\n"
                                   "    for (int j = 0; j < N; j++) y[i] += a[j * N + i];\n  }\n}\n")
    spec = {"kernel": "k", "params": [{"name": "a", "array": "float32", "size": "1024*1024", "init": "uniform(-1,1)", "role": "in"},
                                      {"name": "y", "array": "float32", "size": "1024", "init": "zeros", "role": "inout"}],
            "grid": [4, 1, 1], "block": [256, 1, 1]}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert cli.main(["optimize", str(tmp_path / "k.cu"), "--spec", str(tmp_path / "spec.json"), "--no-kb",
                     "--dry-run", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "(rule:register-accumulate)" in out
    assert "rule register-accumulate: applies" in out
