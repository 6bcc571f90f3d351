"""Launch sizes (hover, code lens, occupancy) and the launch-spec draft read the preprocessed view and the
host code's tree: macros from local headers, comma declarations, cudaMalloc sizes written with macros and
template arguments at the launch all resolve."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kernel_lsp import cli
from kernel_lsp.config import Settings
from kernel_lsp.core.index import build_index
from kernel_lsp.core.launch_dims import evaluate_launch
from kernel_lsp.core.nvcc_output import ResourceUsage
from kernel_lsp.core.parse import comment_ranges
from kernel_lsp.core.source import directive_lines
from kernel_lsp.core.spec import parse_spec
from kernel_lsp.core.spec_draft import PLACEHOLDER, draft_spec
from kernel_lsp.services.kernel_report import report
from kernel_lsp.services.session import Session
from kernel_lsp.services.toolchain import CompileResult

COMMON = """\
#pragma once
#ifndef BLOCK_SIZE
#define BLOCK_SIZE 128
#endif
#define NUM_BINS 64
#define N_ELEMS (1 << 16)
#define BYTES (N_ELEMS * sizeof(float))
"""

HISTOGRAM = """\
#include "common.cuh"
#include <cstdio>

__global__ void histogram(const float *in, unsigned int *bins, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(&bins[(int)(in[i] * NUM_BINS) % NUM_BINS], 1u);
}

int main() {
    float *d_in; unsigned int *d_bins;
    cudaMalloc(&d_in, BYTES);
    cudaMalloc((void **)&d_bins, NUM_BINS * sizeof(unsigned int));
    histogram<<<(N_ELEMS + BLOCK_SIZE - 1) / BLOCK_SIZE, BLOCK_SIZE>>>(d_in, d_bins, N_ELEMS);
}
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "common.cuh").write_text(COMMON)
    path = tmp_path / "hist.cu"
    path.write_text(HISTOGRAM)
    return path


def test_a_block_size_from_a_local_header_gives_the_occupancy(project: Path) -> None:
    index = build_index(HISTOGRAM)
    (launch,) = index.launches
    assert evaluate_launch(launch, HISTOGRAM, index).block_threads is None  # the file alone does not say
    view = Session(Settings()).macro_view(str(project), HISTOGRAM)
    dims = evaluate_launch(launch, HISTOGRAM, index, pre=view)
    assert dims.block == (128, 1, 1) and dims.grid == (512, 1, 1)
    usage = ResourceUsage("_Z9histogramPKfPji", "sm_90", 16, 0, 0, 0, 0, None, None)
    compile = CompileResult(messages=(), resources={"histogram": usage}, by_base_name={"histogram": usage}, returncode=0)
    (facts,) = report(index, HISTOGRAM.encode(), compile, "sm_90", pre=view)
    assert facts.launches[0].block_threads == 128 and facts.launches[0].occupancy is not None
    assert facts.launches[0].occupancy.occupancy_pct == 100.0


def test_a_define_on_the_command_line_beats_the_headers_default(project: Path) -> None:
    index = build_index(HISTOGRAM)
    session = Session(Settings(extra_flags=("-DBLOCK_SIZE=256",)))
    view = session.macro_view(str(project), HISTOGRAM)
    assert "BLOCK_SIZE" not in view.object_macros()  # the guarded default was not taken
    dims = evaluate_launch(index.launches[0], HISTOGRAM, index, session.build_flags(str(project)).defines, view)
    assert dims.block_threads == 256


def test_the_macro_view_follows_the_header(project: Path) -> None:
    session = Session(Settings())
    assert session.macro_view(str(project), HISTOGRAM).object_macros()["NUM_BINS"] == "64"
    header = project.parent / "common.cuh"
    header.write_text(COMMON.replace("NUM_BINS 64", "NUM_BINS 32"))
    stat = header.stat()
    import os

    os.utime(header, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert session.macro_view(str(project), HISTOGRAM).object_macros()["NUM_BINS"] == "32"
    # An open buffer of the header wins over the disk, as in the compile.
    edited = Session(Settings(), buffers={str(header): COMMON.replace("NUM_BINS 64", "NUM_BINS 16")})
    assert edited.macro_view(str(project), HISTOGRAM).object_macros()["NUM_BINS"] == "16"


def test_the_directive_lines_are_directives_only() -> None:
    text = b'#define A 1 /* a comment that\n#define B 2 spans lines */\nint x = 3;\n#define C \\\n  4\n// #define D 5\n'
    lines = [line.rstrip() for line in directive_lines(text, comment_ranges(text))]
    assert lines == ["#define A 1", "#define C \\", "  4"]


def test_the_spec_draft_reads_header_macros_and_malloc_sizes(project: Path) -> None:
    analysis = Session(Settings()).analysis(str(project), HISTOGRAM)
    index = build_index(HISTOGRAM)
    d = draft_spec(index, HISTOGRAM, "histogram", analysis.preprocessed, analysis.kernels["histogram"])
    params = {p["name"]: p for p in d.spec["params"]}
    assert params["n"]["value"] == 1 << 16
    assert params["in"]["size"] == "n" and params["in"]["role"] == "in"
    assert params["bins"]["size"] == 64 and params["bins"]["array"] == "uint32"
    assert d.spec["block"] == [128, 1, 1] and d.spec["grid"] == [512, 1, 1]
    spec = parse_spec(d.spec)
    assert spec.resolve().original.grid == (512, 1, 1)
    # Without the view the header's names stay unknown.
    alone = draft_spec(index, HISTOGRAM, "histogram")
    assert alone.spec["block"][0] == PLACEHOLDER


def test_comma_declarations_give_every_name() -> None:
    src = """
__global__ void mm(const float *a, const float *b, float *c, int m, int n, int k) { c[0] = a[0] * b[0]; }
int main() {
    const int M = 512, N = 384, K = 256;
    float *a, *b, *c;
    cudaMalloc(&a, M * K * sizeof(float)); cudaMalloc(&b, K * N * sizeof(float)); cudaMalloc(&c, M * N * sizeof(float));
    dim3 block(16, 16), grid(N / 16, M / 16);
    mm<<<grid, block>>>(a, b, c, M, N, K);
}
"""
    index = build_index(src)
    dims = evaluate_launch(index.launches[0], src, index)
    assert dims.block == (16, 16, 1) and dims.grid == (24, 32, 1)
    d = draft_spec(index, src, "mm")
    values = {p["name"]: p.get("value", p.get("size")) for p in d.spec["params"]}
    assert (values["m"], values["n"], values["k"]) == (512, 384, 256)
    assert (values["a"], values["b"], values["c"]) == ("m * k", "k * n", "m * n")
    assert d.spec["grid"] == ["n / 16", "m / 16", 1] and d.complete


def test_template_arguments_at_the_launch_give_the_types() -> None:
    src = """
template <typename T, int UNROLL>
__global__ void scale(T *x, T a, int n) { int i = threadIdx.x; if (i < n) x[i] = a * x[i]; }
int main() {
    int n = 4096;
    double *d;
    cudaMalloc(&d, n * sizeof(double));
    scale<double, 4><<<n / 256, 256>>>(d, 3.0, n);
}
"""
    index = build_index(src)
    assert index.launches[0].template_args == ("double", "4")
    assert index.kernels[0].template_params == ("T", "UNROLL")
    d = draft_spec(index, src, "scale")
    x, a, n = d.spec["params"]
    assert (x["array"], x["size"], x["role"]) == ("float64", "n", "inout")
    assert (a["scalar"], a["value"]) == ("float64", 3.0) and n["value"] == 4096
    assert d.complete


def test_a_local_assigned_again_is_not_a_constant() -> None:
    src = """
__global__ void k(float *x, int n) { x[threadIdx.x] = n; }
int main(int argc, char **argv) {
    int threads = 256;
    if (argc > 1) threads = atoi(argv[1]);
    float *x; cudaMalloc(&x, 1024 * sizeof(float));
    k<<<1024 / threads, threads>>>(x, 1024);
}
"""
    index = build_index(src)
    assert evaluate_launch(index.launches[0], src, index).block is None
    assert draft_spec(index, src, "k").spec["block"][0] == PLACEHOLDER


@pytest.mark.nvcc
def test_check_json_shows_the_headers_block_size(project: Path, capsys, monkeypatch) -> None:
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    monkeypatch.chdir(project.parent)
    assert cli.main(["check", str(project), "--json"]) == 0
    (kernel,) = json.loads(capsys.readouterr().out)["kernels"]
    (launch,) = kernel["launches"]
    assert launch["block_threads"] == 128 and launch["occupancy_pct"] is not None


def test_a_guarded_default_in_the_file_yields_to_the_command_line_through_the_view(tmp_path: Path) -> None:
    src = ("#if !defined(TILE)\n#define TILE 16\n#endif\n__global__ void k(float *x) { x[threadIdx.x] = 0; }\n"
           "int main() { float *x; k<<<4, TILE * TILE>>>(x); }\n")
    path = tmp_path / "k.cu"
    index = build_index(src)
    plain = Session(Settings())
    assert evaluate_launch(index.launches[0], src, index, pre=plain.macro_view(str(path), src)).block_threads == 256
    flagged = Session(Settings(extra_flags=("-DTILE=8",)))
    defines = flagged.build_flags(str(path)).defines
    assert evaluate_launch(index.launches[0], src, index, defines, flagged.macro_view(str(path), src)).block_threads == 64
