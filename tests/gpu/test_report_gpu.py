"""``kernel-lsp report --spec`` on a GPU: with no stored profile the kernel is profiled now with the
full set, and its page places it on the roofline (skipped without a GPU)."""

from __future__ import annotations

import os
import re

import pytest

from kernel_lsp import cli

pytestmark = pytest.mark.gpu

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GPU_TOOLS = ("ncu", "nvcc")


def test_report_profiles_a_spec_kernel_and_places_it_on_the_roofline(tmp_path, capsys):
    folder = os.path.join(ROOT, "examples", "streaming")
    out = tmp_path / "report"
    rc = cli.main(["report", os.path.join(folder, "original.cu"), "--spec", os.path.join(folder, "spec.json"),
                   "--out", str(out), "--cache-dir", str(tmp_path / "store"), "--no-kb"])
    assert rc == cli.EXIT_OK
    printed = capsys.readouterr().out
    # A streaming kernel moves DRAM bytes: it has a roofline point and is memory-bound there.
    assert re.search(r"scale_add: .*FLOP/B .*memory-bound", printed), printed
    page = (out / "scale_add.html").read_text(encoding="utf-8")
    assert '<figure id="roofline"><svg' in page and '<figure id="stalls"><svg' in page
