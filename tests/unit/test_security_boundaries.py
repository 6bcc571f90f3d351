"""Every boundary answers what it meets with a message: model replies, workspace reads, the CLI."""

from __future__ import annotations

import argparse
import builtins
import json
import subprocess
import sys
import time

import pytest

from kernel_lsp.commands import verify as verify_command
from kernel_lsp.services import agent, limits
from kernel_lsp.services.agent import InvalidReply, parse_reply, view_file

SPEC = {
    "kernel": "k",
    "params": [{"name": "n", "scalar": "int32", "value": 1024},
               {"name": "x", "array": "float32", "size": "n", "init": "uniform(-1,1)", "role": "inout"}],
    "grid": ["(n+255)/256", 1, 1],
    "block": [256, 1, 1],
}
KERNEL = "__global__ void k(int n, float* x) { int i = threadIdx.x; if (i < n) x[i] *= 2.0f; }\n"


# ---------------------------------------------------------------- model replies


@pytest.mark.parametrize("reply", [
    '{"tool": "view_file", "args": {"path": "a.cu", "start_line": ' + "9" * 5_000 + "}}",
    '{"tool": ' + "9" * 5_000 + ', "args": {}}',
    "[" * 100_000,
    '{"final": {"kernel_source": "' + "x" * 10 + '", "technique": ' + "[" * 50_000 + "}}",
])
def test_hostile_model_replies_are_invalid_replies(reply):
    result = parse_reply(reply, ("view_file", "compile"))
    assert isinstance(result, InvalidReply) and result.why


def test_unknown_tool_with_a_huge_number_is_named_briefly():
    result = parse_reply('{"tool": ' + "9" * 4_000 + ', "args": {}}', ("compile",))
    assert isinstance(result, InvalidReply) and len(result.why) < 200


# ---------------------------------------------------------------- view_file


def test_unreadable_workspace_file_is_an_answer_not_an_exception(tmp_path, monkeypatch):
    (tmp_path / "locked.cu").write_text("__global__ void k() {}\n")
    real_open = builtins.open

    def refusing_open(path, *args, **kwargs):
        if str(path).endswith("locked.cu"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", refusing_open)
    answer = view_file(str(tmp_path), "locked.cu")
    assert answer == "error: cannot read locked.cu (Permission denied)"


def test_view_file_with_odd_names_and_lines(tmp_path):
    (tmp_path / "a.cu").write_text("line\n" * 3)
    assert view_file(str(tmp_path), "a.cu", start_line=10**4000).startswith("error: a.cu has only 3 lines")
    assert view_file(str(tmp_path), "\udcff.cu").startswith("error:")
    assert view_file(str(tmp_path), "../../etc/passwd").endswith("is outside the workspace")


def test_search_goes_on_after_an_unreadable_file(tmp_path, monkeypatch):
    """The tool loop hands the model the error text (the search is not aborted)."""
    answers = []
    monkeypatch.setattr(agent, "_view_file", lambda *a: (_ for _ in ()).throw(OSError(5, "Input/output error")))
    answers.append(view_file(str(tmp_path), "x.cu"))
    assert answers == ["error: cannot read x.cu (Input/output error)"]


# ---------------------------------------------------------------- verify and check on the command line


def _verify(argv):
    parser = argparse.ArgumentParser()
    verify_command.add_parser(parser.add_subparsers())
    args = parser.parse_args(["verify", *argv])
    return args.func(args)


def _files(tmp_path, spec_text: str | bytes) -> list[str]:
    (tmp_path / "o.cu").write_text(KERNEL)
    (tmp_path / "s.json").write_bytes(spec_text if isinstance(spec_text, bytes) else spec_text.encode())
    return [str(tmp_path / "o.cu"), str(tmp_path / "o.cu"), "--spec", str(tmp_path / "s.json")]


@pytest.mark.parametrize("spec_text, why", [
    ("[" * 100_000, "nested too deeply"),
    ('{"kernel": "k", "params": [{"name": "n", "scalar": "int32", "value": ' + "9" * 5_000 + "}]}", "not valid JSON"),
    (json.dumps({**SPEC, "grid": ["((1<<(1<<24))-1)*((1<<(1<<24))-1)", 1, 1]}), "2^64"),
    (b"\xff\xfe not utf-8", "not UTF-8 text"),
])
def test_verify_bad_specs_exit_2_with_a_message(tmp_path, capsys, spec_text, why):
    assert _verify(_files(tmp_path, spec_text)) == 2
    err = capsys.readouterr().err
    assert why in err and "Traceback" not in err


def test_verify_refuses_arrays_larger_than_the_gpu(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(limits, "device_memory_bytes", lambda: 141 * 2**30)
    monkeypatch.setattr(limits, "host_memory_bytes", lambda: 2**40)
    spec = {**SPEC, "params": [{"name": "n", "scalar": "int64", "value": 10 * 2**30},
                               {"name": "x", "array": "float64", "size": "n", "init": "zeros", "role": "inout"}],
            "grid": [1, 1, 1]}
    assert _verify(_files(tmp_path, json.dumps(spec))) == 2
    assert "more than the GPU's memory (141.0 GiB)" in capsys.readouterr().err


def test_verify_bad_candidate_launch_exits_2(tmp_path, capsys):
    argv = _files(tmp_path, json.dumps(SPEC)) + ["--candidate-launch", "[" * 100_000]
    assert _verify(argv) == 2
    assert "--candidate-launch" in capsys.readouterr().err


def test_check_reduced_mode_for_big_files(tmp_path):
    unit = "__global__ void k{n}(float* a) {{ a[threadIdx.x] *= 2.0f; }}\n"
    (tmp_path / "big.cu").write_text("".join(unit.format(n=n) for n in range(110_000)))
    assert (tmp_path / "big.cu").stat().st_size > 5 * 2**20
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "kernel_lsp", "check", "big.cu", "--no-compile"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "reduced mode" in done.stderr and "0 kernels" in done.stdout
    # A bound on the work, not a speed target: a file 20x the size limit must not be analysed in full.
    assert time.monotonic() - start < 90


def test_check_nested_compile_database_is_a_message_not_a_traceback(tmp_path):
    (tmp_path / "k.cu").write_text(KERNEL)
    (tmp_path / "compile_commands.json").write_text("[" * 200_000)
    done = subprocess.run([sys.executable, "-m", "kernel_lsp", "check", "k.cu", "--nvcc", "/no/such/nvcc"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "KERNEL_LSP_CONFIG": str(tmp_path / "none.json"),
                               **{k: v for k, v in __import__("os").environ.items() if k == "PYTHONPATH"}})
    assert done.returncode == 0, done.stderr
    assert "nested too deeply" in done.stderr and "Traceback" not in done.stderr
