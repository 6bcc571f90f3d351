"""verify() up to the GPU: compile, signature, static check, entry lookup (needs nvcc, not a GPU)."""

import importlib.util
import shutil
import threading

import pytest

from kernel_lsp.core.spec import SpecError, parse_spec
from kernel_lsp.core.verdict import Reason, Verdict
from kernel_lsp.services.harness import GpuUnavailable, VerifyCancelled, VerifyOptions, verify
from kernel_lsp.services.harness.compile import compile_cubin, find_entry, mangled_base_name
from kernel_lsp.services.toolchain import BuildFlags
from kernel_lsp.services.harness.verify import smallest_variant

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")

SPEC = parse_spec({
    "kernel": "scale",
    "params": [
        {"name": "n", "scalar": "int32", "value": 1048576},
        {"name": "x", "array": "float32", "size": "n", "init": "uniform(-1,1)", "role": "in"},
        {"name": "y", "array": "float32", "size": "n", "role": "out"},
    ],
    "grid": ["(n+255)/256", 1, 1],
    "block": [256, 1, 1],
    "variants": [{"n": 5000}, {"n": 77}],
})
ORIGINAL = """__global__ void scale(int n, const float* x, float* y)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
"""
OPTIONS = VerifyOptions(arch="sm_90", timeout_s=60)


def test_mangled_base_names():
    assert mangled_base_name("_Z5scaleiPKfPf") == "scale"
    assert mangled_base_name("_ZN2ns1kIfEEvPT_i") == "k"
    assert mangled_base_name("_ZL6staticPf") == "static"
    assert mangled_base_name("saxpy") == "saxpy"


def test_find_entry():
    assert find_entry(("_Z5scaleiPKfPf", "_Z6scale2Pf"), "scale") == ("_Z5scaleiPKfPf", "")
    assert find_entry(("scale",), "scale") == ("scale", "")
    assert find_entry(("_ZN2ns1kIfEEvPT_i",), "ns::k")[0] == "_ZN2ns1kIfEEvPT_i"
    entry, problem = find_entry(("_Z1kIfEvPT_", "_Z1kIdEvPT_"), "k")
    assert entry is None and "ambiguous" in problem
    entry, problem = find_entry(("_Z5otherPf",), "scale")
    assert entry is None and "_Z5otherPf" in problem


def test_smallest_variant():
    assert smallest_variant(SPEC) == 1


@needs_nvcc
def test_compile_reads_mangled_entries(tmp_path):
    result = compile_cubin(ORIGINAL + "extern \"C\" __global__ void plain(float* p) { p[0] = 1; }\n", str(tmp_path), "k",
                           BuildFlags().for_arch("sm_90"))
    assert result.ok and set(result.entries) == {"_Z5scaleiPKfPf", "plain"}
    # Entries and resources come from one reading of ptxas's output.
    assert {u.mangled_name for u in result.resources.values()} == set(result.entries)
    assert result.resources_for("scale").registers_per_thread is not None
    assert (tmp_path / "k.cubin").stat().st_size > 0


@needs_nvcc
def test_compile_error_verdict_names_the_line():
    verdict = verify(ORIGINAL, ORIGINAL.replace("y[i] = 2.0f * x[i];", "y[i] = 2.0f * x[i]"), SPEC, OPTIONS)
    assert not verdict.accepted and verdict.reason is Reason.COMPILE_ERROR
    assert "candidate.cu(5)" in verdict.errors[0]
    assert Verdict.from_json(verdict.to_json()) == verdict


@needs_nvcc
def test_signature_change_is_rejected_before_the_gpu():
    verdict = verify(ORIGINAL, ORIGINAL.replace("int n, const float* x", "long long n, const float* x"), SPEC, OPTIONS)
    assert verdict.reason is Reason.SIGNATURE_CHANGED and "parameter 1" in verdict.errors[0]


@needs_nvcc
def test_static_check_is_rejected_before_the_gpu():
    verdict = verify(ORIGINAL, ORIGINAL.replace("if (i < n)", "if (n == 1048576 || i < n)"), SPEC, OPTIONS)
    assert verdict.reason is Reason.STATIC_CHECK
    assert verdict.static_findings[0].rule == "problem-size-literal" and verdict.static_findings[0].line == 4


def test_a_spec_that_does_not_fit_the_original_is_a_spec_error():
    with pytest.raises(SpecError, match="params"):
        verify(ORIGINAL.replace("int n, ", ""), ORIGINAL, SPEC, OPTIONS)


@needs_nvcc
@pytest.mark.skipif(importlib.util.find_spec("pycuda") is not None, reason="pycuda is installed: the GPU tests cover this path")
def test_without_pycuda_the_harness_says_there_is_no_gpu():
    with pytest.raises(GpuUnavailable, match="no CUDA GPU available"):
        verify(ORIGINAL, ORIGINAL, SPEC, OPTIONS)


@needs_nvcc
def test_cancel_stops_the_verification():
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(VerifyCancelled):
        verify(ORIGINAL, ORIGINAL, SPEC, OPTIONS, cancel=cancel)


def _cli(argv):
    import argparse

    from kernel_lsp.commands import verify as command

    parser = argparse.ArgumentParser()
    command.add_parser(parser.add_subparsers())
    args = parser.parse_args(["verify", *argv])
    return args.func(args)


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_cli_bad_spec_exits_2_and_names_the_field(tmp_path, capsys):
    spec = SPEC.to_json()
    spec["params"][1]["size"] = "m"
    code = _cli([_write(tmp_path, "o.cu", ORIGINAL), _write(tmp_path, "c.cu", ORIGINAL), "--spec", _write(tmp_path, "s.json", __import__("json").dumps(spec))])
    assert code == 2 and "params[1].size: unknown name 'm'" in capsys.readouterr().err


def test_cli_missing_file_exits_2(tmp_path, capsys):
    assert _cli([str(tmp_path / "nope.cu"), str(tmp_path / "nope.cu"), "--spec", str(tmp_path / "s.json")]) == 2
    assert "nope.cu" in capsys.readouterr().err


def test_cli_without_spec_needs_an_in_source_one(tmp_path, capsys):
    assert _cli([_write(tmp_path, "o.cu", ORIGINAL), _write(tmp_path, "c.cu", ORIGINAL)]) == 2
    assert "kernel-lsp: spec" in capsys.readouterr().err


@needs_nvcc
def test_cli_rejection_exits_1_with_json(tmp_path, capsys):
    import json

    inline = "// kernel-lsp: spec " + json.dumps({k: v for k, v in SPEC.to_json().items() if k != "kernel"}) + "\n"
    original = _write(tmp_path, "o.cu", inline + ORIGINAL)
    candidate = _write(tmp_path, "c.cu", ORIGINAL.replace("int n, const float* x", "long long n, const float* x"))
    assert _cli([original, candidate, "--json", "--arch", "sm_90"]) == 1
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["reason"] == "signature_changed" and verdict["accepted"] is False and verdict["seeds"] == [1, 2, 3]


def test_options_from_the_session(tmp_path):
    from kernel_lsp.config import Settings
    from kernel_lsp.services.session import Session

    settings = Settings(verify_seeds=5, min_speedup=1.2, verify_timeout_s=30.0, extra_flags=("-O3",))
    options = Session(settings).verify_options(str(tmp_path / "k.cu"), sanitize=True)
    assert (options.seeds, options.min_speedup, options.timeout_s, options.sanitize) == (5, 1.2, 30.0, True)
    assert options.build.flags == ("-I", str(tmp_path), "-O3")
    assert options.arch is None


@needs_nvcc
def test_module_variables_are_read_from_the_cubin(tmp_path):
    from kernel_lsp.services.harness.compile import device_globals

    source = """
__device__ unsigned int counter;
__device__ float cache[1024];
__managed__ int flag;
__constant__ float coef[4];
namespace ns { __device__ int hidden; }
extern "C" __global__ void k(float* y)
{
    y[threadIdx.x] = cache[threadIdx.x] + coef[0] + flag + ns::hidden;
    counter++;
}
"""
    built = compile_cubin(source, str(tmp_path), "g", BuildFlags().for_arch("sm_90"))
    assert built.ok, built.log
    found = dict(device_globals((tmp_path / "g.cubin").read_bytes()))
    assert found["counter"] == 4 and found["cache"] == 4096 and found["flag"] == 4
    assert "coef" not in found  # __constant__: no kernel can write it
    assert any(name.startswith("_ZN2ns") for name in found)
    assert device_globals(b"not an elf file") == ()


@needs_nvcc
def test_the_harness_kernels_compile_and_are_cached_on_disk(tmp_path, monkeypatch):
    from kernel_lsp.services.harness.verify import helper_cubin

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first = helper_cubin(str(tmp_path), "sm_90", OPTIONS)
    assert first.ok, first.log
    assert {"klsp_gen_f32", "klsp_gen_i64", "klsp_fill_u64", "klsp_diff"} <= set(first.entries)
    assert first.cubin_path.startswith(str(tmp_path / "cache"))
    again = helper_cubin(str(tmp_path), "sm_90", OPTIONS)
    assert again.cubin_path == first.cubin_path and again.wall_s == 0.0
