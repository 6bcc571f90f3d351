"""A real sweep on the GPU: ``kernel-lsp sweep --engine ray`` starts a Ray cluster of this machine, whose one GPU
runs the kernels' tasks (``num_gpus=1``) through the harness; then a second sweep reuses every outcome and
``--apply`` writes the accepted rewrite into a clean git working tree.

Skipped as "no GPU" without one (tests/gpu/conftest.py), and without Ray installed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from kernel_lsp import cli

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.gpu


def _git(folder: Path, *args: str) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True, env=env)


def test_ray_sweep_on_one_gpu_verifies_resumes_and_applies(tmp_path: Path, monkeypatch, capsys) -> None:
    pytest.importorskip("ray")
    src = tmp_path / "src"
    src.mkdir()
    for example, kernel in (("transpose", "transpose"), ("histogram", "seg_histogram")):
        shutil.copy(EXAMPLES / example / "original.cu", src / f"{example}.cu")
        shutil.copy(EXAMPLES / example / "spec.json", src / f"{example}.cu.{kernel}.spec.json")
    _git(src, "init", "-q")
    _git(src, "add", "-A")
    _git(src, "commit", "-qm", "kernels")
    monkeypatch.chdir(src)
    # Ray's workers import kernel-lsp as this process does.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    argv = ["sweep", ".", "--engine", "ray", "--budget", "3", "--kb", str(tmp_path / "kb.sqlite3"),
            "--out", str(tmp_path / "out"), "--json"]
    assert cli.main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    outcomes = {o["kernel"]: o for o in first["outcomes"]}
    assert first["engine"] == "ray" and first["ran"] == 2
    transpose = outcomes["transpose"]
    assert transpose["status"] == "accepted", transpose
    assert transpose["technique"] == "transpose-via-shared-memory" and transpose["speedup_ci_low"] >= 1.5
    assert transpose["gpu"] and transpose["patch_file"]
    assert all(o["status"] in ("accepted", "none-faster") and o["verified"] > 0 for o in first["outcomes"])

    assert cli.main([*argv, "--apply"]) == 0
    second = json.loads(capsys.readouterr().out)
    assert second["ran"] == 0  # every outcome kept: nothing verified again
    assert "transpose.cu:transpose" in second["apply"]["applied"]
    assert (src / "transpose.cu").read_text() != (EXAMPLES / "transpose" / "original.cu").read_text()
    html = (tmp_path / "out" / "sweep.html").read_text()
    assert "<svg" in html and "transpose.cu:transpose" in html
