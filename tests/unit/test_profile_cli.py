"""``kernel-lsp profile`` and ``kernel-lsp tree`` on the CPU: usage errors, tree show, tree refine."""

from __future__ import annotations

import json
import os

from kernel_lsp.cli import main
from kernel_lsp.core import profiling_tree as T
from kernel_lsp.services.profiler import default_tree_path

FIX = os.path.join(os.path.dirname(__file__), "..", "fixtures", "ncu")


def test_tree_show_prints_every_node(capsys):
    assert main(["tree", "show"]) == 0
    out = capsys.readouterr().out
    assert "profiling tree 'learned' (format version 2)" in out
    for node in ("busy", "memory_side", "memory_causes", "compute_pipes", "small_grid", "stalls", "fallback"):
        assert f"[{node}]" in out
    with open(default_tree_path(), encoding="utf-8") as f:
        source = [n for n in T.parse_tree(f.read()).leaves() if n.state_from == "source"]
    assert source and all(f"[{n.id}] collect: nothing more; the optimizer ranks by the source's state" in out
                          for n in source)
    assert main(["tree", "show", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["format"] == "kernel-lsp-profiling-tree"


def test_tree_show_rejects_a_bad_tree(tmp_path, capsys):
    bad = tmp_path / "t.json"
    bad.write_text('{"format": "kernel-lsp-profiling-tree", "version": 9, "nodes": {}}')
    assert main(["tree", "show", "--tree", str(bad)]) == 2
    assert "version" in capsys.readouterr().err


def test_tree_refine_on_the_recorded_dataset(tmp_path, capsys):
    out = tmp_path / "refined.json"
    code = main(["tree", "refine", "--dataset", os.path.join(FIX, "dataset"), "--sources", os.path.join(FIX, "programs"),
                 "--rounds", "1", "--out", str(out)])
    assert code == 0
    err = capsys.readouterr().err
    assert "27 samples; agreement" in err and "round 1:" in err
    assert json.loads(out.read_text())["version"] == 2


def test_profile_usage_errors(tmp_path, capsys):
    source = tmp_path / "k.cu"
    source.write_text("__global__ void k(float *p) { p[0] = 1; }\n")
    assert main(["profile", str(source)]) == 2
    assert "--kernel" in capsys.readouterr().err
    assert main(["profile", str(source), "--kernel", "k", "--cache-dir", str(tmp_path / "c")]) == 2
    assert "no launch spec for k" in capsys.readouterr().err
    assert main(["profile", str(tmp_path / "missing.cu"), "--kernel", "k"]) == 2


def fake_nvidia_smi(tmp_path, monkeypatch, *, gpu: bool) -> None:
    """An ``nvidia-smi`` first on PATH that reports an H200, or (``gpu=False``) no device, as the real one does."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "nvidia-smi"
    script.write_text("#!/bin/sh\necho 'NVIDIA H200, 9.0'\n" if gpu else "#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_profile_without_ncu_fails_with_a_message(tmp_path, monkeypatch, capsys):
    fake_nvidia_smi(tmp_path, monkeypatch, gpu=True)
    source = tmp_path / "k.cu"
    source.write_text("__global__ void k(float *p) { p[0] = 1; }\n")
    code = main(["profile", str(source), "--kernel", "k", "--program", "/bin/true", "--ncu", "/nonexistent/ncu",
                 "--cache-dir", str(tmp_path / "c"), "--json"])
    assert code == 1
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is False and "was not found" in data["message"]


def test_profile_without_a_gpu_exits_3_as_verify_and_optimize_do(tmp_path, monkeypatch, capsys):
    fake_nvidia_smi(tmp_path, monkeypatch, gpu=False)
    source = tmp_path / "k.cu"
    source.write_text("__global__ void k(float *p) { p[0] = 1; }\n")
    for extra in (["--program", "/bin/true"], ["--spec", os.path.join(FIX, "..", "..", "..", "examples", "gemv", "spec.json")]):
        code = main(["profile", str(source), "--kernel", "k", "--ncu", "/nonexistent/ncu",
                     "--cache-dir", str(tmp_path / "c"), *extra])
        assert code == 3, extra
        assert "nothing profiled, no GPU here (nvidia-smi found no GPU (No devices were found))" in capsys.readouterr().err
