"""``kernel-lsp report``: HTML pages per kernel with a roofline, stall bars and the optimization
history, from recorded H200 profiles (tests/fixtures/ncu/dataset/zoo_full.csv.gz, made from
tests/fixtures/ncu/programs/zoo.cu) and a knowledge base holding attempts; each page is rendered
by headless Chromium (Debian's ``chromium``) and its screenshot must not be blank."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from kernel_lsp import cli
from kernel_lsp.core.kb_logic import Attempt
from kernel_lsp.services.kb import KnowledgeBase

REPO = Path(__file__).resolve().parents[2]
ZOO = REPO / "tests" / "fixtures" / "ncu" / "programs" / "zoo.cu"
ZOO_CSV = REPO / "tests" / "fixtures" / "ncu" / "dataset" / "zoo_full.csv.gz"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = pytest.mark.timeout(240)


def _attempt(technique: str, speedup: float | None, accepted: bool, verdict: str, n: int) -> Attempt:
    return Attempt(kernel_hash="k", file=str(ZOO), kernel="z_reduce", state="barrier-stalls", technique=technique,
                   candidate_hash=f"c{n}", verdict=verdict, accepted=accepted, speedup=speedup,
                   generator="rule:test", created_at=f"2026-01-0{n}T00:00:00Z")


@pytest.fixture
def kb_path(tmp_path: Path) -> Path:
    path = tmp_path / "kb.sqlite3"
    kb = KnowledgeBase.open(path)
    try:
        kb.record_attempt(_attempt("warp-shuffle-reduction", 1.84, True, "accepted", 1))
        kb.record_attempt(_attempt("block-size-tuning", 0.97, False, "slower", 2))
        kb.record_attempt(_attempt("thread-coarsening", None, False, "incorrect", 3))
    finally:
        kb.close()
    return path


def _report(tmp_path: Path, kb_path: Path, *kernels: str) -> Path:
    out = tmp_path / "report"
    args = ["report", str(ZOO), "--ncu-csv", str(ZOO_CSV), "--kb", str(kb_path), "--out", str(out),
            "--cache-dir", str(tmp_path / "profiles")]
    for kernel in kernels:
        args += ["--kernel", kernel]
    assert cli.main(args) == cli.EXIT_OK
    return out


def test_a_page_per_kernel_with_roofline_stalls_and_history(tmp_path: Path, kb_path: Path, capsys) -> None:
    out = _report(tmp_path, kb_path, "z_reduce", "z_fma_chain8", "z_copy")
    printed = capsys.readouterr().out
    assert re.search(r"z_reduce: .*z_reduce\.html .*memory-bound", printed)
    assert re.search(r"z_fma_chain8: .*compute-bound, FP32 8\d\.\d% of peak", printed)
    page = (out / "z_reduce.html").read_text(encoding="utf-8")
    for figure in ("roofline", "stalls", "history"):
        assert re.search(rf'<figure id="{figure}"><svg', page), figure
    assert "warp-shuffle-reduction" in page and "1.84x" in page and "best verified speedup" in page
    assert "long scoreboard" in page  # the top stall of this reduction on the H200
    # A kernel without attempts has no history chart but says so.
    fma = (out / "z_fma_chain8.html").read_text(encoding="utf-8")
    assert '<figure id="roofline">' in fma and '<figure id="history">' not in fma
    assert "No verified attempts yet" in fma
    index = (out / "index.html").read_text(encoding="utf-8")
    assert all(f'href="{k}.html"' in index for k in ("z_reduce", "z_fma_chain8", "z_copy"))


def test_a_kernel_without_a_profile_says_how_to_get_one(tmp_path: Path, capsys) -> None:
    source = tmp_path / "k.cu"
    source.write_text("__global__ void lonely(float* x) { x[threadIdx.x] = 1.0f; }\n", encoding="utf-8")
    out = tmp_path / "r"
    assert cli.main(["report", str(source), "--no-kb", "--out", str(out), "--cache-dir", str(tmp_path / "p")]) == 0
    page = (out / "lonely.html").read_text(encoding="utf-8")
    assert "No profile yet" in page and "<svg" not in page
    assert "lonely: no profile" in capsys.readouterr().err


def test_a_spec_that_cannot_be_profiled_without_a_gpu_exits_3_with_the_pages_written(tmp_path: Path, monkeypatch,
                                                                                      capsys) -> None:
    # nvidia-smi that finds no device, as on a machine without a GPU; ncu absent.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    source = tmp_path / "gemv.cu"
    shutil.copy(REPO / "examples" / "gemv" / "original.cu", source)
    out = tmp_path / "r"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    code = cli.main(["report", str(source), "--spec", str(REPO / "examples" / "gemv" / "spec.json"), "--no-kb",
                     "--ncu", str(tmp_path / "no-ncu"), "--out", str(out), "--cache-dir", str(tmp_path / "p")])
    assert code == cli.EXIT_NO_GPU == 3
    assert "No profile yet" in (out / "gemv.html").read_text(encoding="utf-8")
    assert "gemv not profiled, no GPU here" in capsys.readouterr().err


def _screenshot(page: Path, png: Path, profile_dir: Path) -> np.ndarray:
    argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile_dir}",
            "--window-size=1200,1800", f"--screenshot={png}", page.as_uri()]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert png.exists(), f"chromium wrote no screenshot (rc {result.returncode}):\n{result.stderr[-2000:]}"
    return np.asarray(Image.open(png).convert("L"), dtype=np.float64)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_chromium_renders_the_pages_with_their_charts(tmp_path: Path, kb_path: Path) -> None:
    out = _report(tmp_path, kb_path, "z_reduce")
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>", encoding="utf-8")

    empty = _screenshot(blank, tmp_path / "blank.png", tmp_path / "chromium-blank")
    shot = _screenshot(out / "z_reduce.html", tmp_path / "z_reduce.png", tmp_path / "chromium")

    assert empty.var() < 1.0  # the measure itself: a blank page has no variance
    assert shot.var() > 500.0, f"pixel variance {shot.var():.1f}: the page looks blank"
    # Ink in the chart area (the roofline sits below the title and facts), not only in the heading.
    ink_rows = np.flatnonzero((shot < 200).sum(axis=1) > 20)
    assert ink_rows.size > 300 and ink_rows.max() > 900, (ink_rows.size, ink_rows.max() if ink_rows.size else None)
