"""The shared-tile store transformation: where it applies, each refusal with its missing fact,
the ragged-edge guard kept as the store's guard, and the candidates compiled by nvcc."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kernel_lsp.core.rules import evaluate, rule_by_name
from kernel_lsp.core.spec import parse_spec

CORPUS = Path(__file__).resolve().parents[2] / "benchmarks" / "corpus"


def spec_of(kernel: str, params: list[dict], grid, block, variants=None) -> dict:
    data = {"kernel": kernel, "params": params, "grid": grid, "block": block}
    if variants:
        data["variants"] = variants
    return data


def arr(name, size, role="in"):
    return {"name": name, "array": "float32", "size": size, "init": "uniform(-1,1)" if role != "out" else "zeros", "role": role}


def scalar(name, value):
    return {"name": name, "scalar": "int32", "value": value}


def outcome(source: str, spec: dict):
    return evaluate(source, spec["kernel"], parse_spec(spec), [rule_by_name("shared-tile-store")])[0]


def compiles(source: str, folder: Path) -> None:
    from kernel_lsp.services.harness.compile import compile_cubin
    from kernel_lsp.services.toolchain import BuildFlags

    folder.mkdir(parents=True, exist_ok=True)
    result = compile_cubin(source, str(folder), "cand", BuildFlags().for_arch("sm_90"))
    assert result.ok, result.log


TRANSPOSE = """
__global__ void transpose(const float* in, float* out, int n, int m) {
  int x = blockIdx.x * blockDim.x + threadIdx.x;
  int y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < n && y < m)
    out[x * m + y] = in[y * n + x];
}
"""
# Ragged at both sizes: 1000 x 999 and 37 x 45 are not multiples of the 32 x 8 block.
TRANSPOSE_SPEC = spec_of("transpose", [arr("in", "n*m"), arr("out", "n*m", "out"), scalar("n", 1000), scalar("m", 999)],
                         ["ceil_div(n,32)", "ceil_div(m,8)", 1], [32, 8, 1], [{"n": 37, "m": 45}])


def test_a_guarded_transpose_store_is_staged_and_the_guard_kept(tmp_path):
    found = outcome(TRANSPOSE, TRANSPOSE_SPEC)
    assert found.applicable, found.why
    source = found.rewrites[0].source
    # The guard decides what is staged; the barriers are outside it, reached by every thread.
    guarded, flush = source.split("if (x < n && y < m)", 1)[1].split("__syncthreads();", 1)
    assert "kl_tile_set[kl_mine] = 1;" in guarded and "out[kl_tile_index[kl_slot]] = kl_tile_value[kl_slot];" in flush
    body = source.split("{", 1)[1]
    assert body.index("kl_tile_set[kl_mine] = 0;") < body.index("if (x < n && y < m)") < body.index("__syncthreads();")
    # The tile: the spec's 32 x 8 block, each row padded by one slot.
    assert "kl_tile_value[288]" in source and "<= 288u" in source
    if shutil.which("nvcc"):
        compiles(source, tmp_path)


@pytest.mark.parametrize(("change", "why"), [
    (lambda s: s.replace("out[x * m + y] = in[y * n + x];", "out[x * m + y] = in[y * n + x] + out[0];"),
     "accessed elsewhere"),
    (lambda s: s.replace("  if (x < n && y < m)\n", "  if (x >= n || y >= m) return;\n"), "a return before the kernel's end"),
    (lambda s: s.replace("  if (x < n && y < m)\n", "  for (int k = 0; k < x; k++) if (x < n && y < m)\n"),
     "depends on the thread"),
    (lambda s: s.replace("out[x * m + y] = in[y * n + x];", "for (int k = 0; k < 2; k++) out[x * m + y] = in[y * n + x];"),
     "another loop"),
    (lambda s: s.replace("out[x * m + y] = in[y * n + x];", "{ int k = 0; while (k < 2) { out[x * m + y] = in[y * n + k]; k++; } }"),
     "another loop"),
    (lambda s: s.replace("out[x * m + y] = in[y * n + x];", "{ __syncthreads(); out[x * m + y] = in[y * n + x]; }"),
     "barriers"),
    (lambda s: s.replace("out[x * m + y] = in[y * n + x];", "out[x * m + y] += in[y * n + x];"),
     "no uncoalesced global store"),
    (lambda s: s.replace("out[x * m + y] = in[y * n + x];", "out[y * n + x] = in[x * m + y];"),
     "no uncoalesced global store"),
    (lambda s: s.replace("out[x * m + y] = in[y * n + x];", "out[x * m + 2 * y] = in[y * n + x];"),
     "no unit stride along threadIdx.y"),
    (lambda s: s.replace("out[x * m + y] = in[y * n + x];", "out[x * m + y] = in[y * n + x]++;"),
     "side effects"),
])
def test_refusals_name_the_missing_fact(change, why):
    found = outcome(change(TRANSPOSE), TRANSPOSE_SPEC)
    assert not found.applicable and why in found.why, found.why


def test_refused_when_the_rows_written_back_are_too_short():
    spec = {**TRANSPOSE_SPEC, "block": [128, 2, 1], "grid": ["ceil_div(n,128)", "ceil_div(m,2)", 1]}
    found = outcome(TRANSPOSE, spec)
    assert not found.applicable and "blockDim.y is below" in found.why


@pytest.mark.parametrize("name", ["nvblog_transpose_naive", "llmc_matmul_forward_kernel1"])
def test_corpus_kernels(name, tmp_path):
    folder = CORPUS / name
    spec = json.loads((folder / "spec.json").read_text())
    found = evaluate((folder / "kernel.cu").read_text(), spec["kernel"], parse_spec(spec),
                     [rule_by_name("shared-tile-store")])[0]
    assert found.applicable, found.why
    source = found.rewrites[0].source
    assert source.count("__syncthreads();") == 2
    if shutil.which("nvcc"):
        # The corpus's kernels include ../_common/: the same layout in the scratch folder.
        shutil.copytree(CORPUS / "_common", tmp_path / "_common")
        compiles(source, tmp_path / name)


@pytest.mark.parametrize("name", ["llmc_permute_kernel", "rodinia_kmeans_invert_mapping", "sgemmcuda_naive"])
def test_corpus_kernels_refused_with_a_reason(name):
    folder = CORPUS / name
    spec = json.loads((folder / "spec.json").read_text())
    found = evaluate((folder / "kernel.cu").read_text(), spec["kernel"], parse_spec(spec),
                     [rule_by_name("shared-tile-store")])[0]
    assert not found.applicable and found.why
