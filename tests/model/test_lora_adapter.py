"""A PEFT LoRA adapter converted to GGUF (``kernel-lsp models convert-lora``) and loaded over the real 0.5B.

The adapter is made here (seeded random factors of PEFT's names and shapes for the 0.5B's attention
projections): what is tested is the conversion and the load, not what an adapter learned. Its factors
are large enough that greedy answers change, which is how the test sees llama.cpp apply it rather
than ignore it. Skipped, with the reason, without the gguf and safetensors packages, llama-cpp-python
or the installed 0.5B.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_lsp.services import models

MODEL = "qwen2.5-coder-0.5b-instruct-q4_k_m"
ROOT = Path(__file__).resolve().parents[2]
#: Qwen2.5-Coder-0.5B: 24 blocks of width 896, keys and values 128 wide (2 KV heads of 64).
BLOCKS, WIDTH, KV_WIDTH = 24, 896, 128
RANK, ALPHA = 4, 8

gguf = pytest.importorskip("gguf", reason="the gguf package is not installed (pip install 'kernel-lsp[model]')")
safetensors_numpy = pytest.importorskip("safetensors.numpy", reason="safetensors is not installed")
import numpy  # noqa: E402

from kernel_lsp.services.lora_gguf import LoraConversionError, convert  # noqa: E402


@pytest.fixture(scope="module")
def base_model() -> Path:
    try:
        return models.resolve_model(MODEL)
    except models.ModelError as exc:
        pytest.skip(f"{exc} (data dir {models.data_dir()})")


def write_adapter(folder: Path, *, scale: float = 0.05, widths: tuple[int, int] = (WIDTH, KV_WIDTH),
                  **config) -> Path:
    """A PEFT adapter folder: q_proj and v_proj of every block at rank 4, as PEFT's save_pretrained names them."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = numpy.random.default_rng(7)
    tensors = {}
    for block in range(BLOCKS):
        for module, width_out in (("q_proj", widths[0]), ("v_proj", widths[1])):
            name = f"base_model.model.model.layers.{block}.self_attn.{module}"
            tensors[f"{name}.lora_A.weight"] = (rng.standard_normal((RANK, widths[0])) * scale).astype(numpy.float32)
            tensors[f"{name}.lora_B.weight"] = (rng.standard_normal((width_out, RANK)) * scale).astype(numpy.float32)
    safetensors_numpy.save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": RANK, "lora_alpha": ALPHA, "target_modules": ["q_proj", "v_proj"],
        "bias": "none", "base_model_name_or_path": "Qwen/Qwen2.5-Coder-0.5B-Instruct", **config}))
    return folder


def test_the_cli_writes_an_adapter_llama_cpp_reads_as_a_lora_of_the_base(base_model: Path, tmp_path: Path) -> None:
    adapter = write_adapter(tmp_path / "adapter")
    out = tmp_path / "adapter.gguf"
    done = subprocess.run([sys.executable, "-m", "kernel_lsp", "models", "convert-lora", str(adapter),
                           "--base", MODEL, "--out", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"{BLOCKS * 2} LoRA pairs, rank {RANK}, alpha {ALPHA}, qwen2" in done.stdout
    reader = gguf.GGUFReader(str(out))
    assert reader.fields["general.type"].contents() == "adapter"
    assert reader.fields["adapter.type"].contents() == "lora"
    assert reader.fields["adapter.lora.alpha"].contents() == pytest.approx(ALPHA)
    shapes = {t.name: tuple(int(n) for n in t.shape) for t in reader.tensors}
    assert len(shapes) == BLOCKS * 4
    # ggml's order, the inner dimension first: A is (in, r), B is (r, out), as llama.cpp checks them.
    assert shapes["blk.0.attn_q.weight.lora_a"] == (WIDTH, RANK)
    assert shapes["blk.23.attn_v.weight.lora_b"] == (RANK, KV_WIDTH)
    assert not (tmp_path / "adapter.gguf.partial").exists()
    assert {t.tensor_type.name for t in reader.tensors} == {"F32"}
    half = convert(adapter, base_model, tmp_path / "half.gguf", dtype="f16")
    assert {t.tensor_type.name for t in gguf.GGUFReader(str(half.path)).tensors} == {"F16"}
    assert half.size_bytes < 0.6 * out.stat().st_size


def test_an_adapter_of_another_model_or_form_is_refused_with_the_reason(base_model: Path, tmp_path: Path) -> None:
    wrong = write_adapter(tmp_path / "wrong", widths=(1024, 128))
    with pytest.raises(LoraConversionError, match=r"blk\.0\.attn_q\.weight: lora_A \(4, 1024\).*trained on another"):
        convert(wrong, base_model, tmp_path / "wrong.gguf")
    dora = write_adapter(tmp_path / "dora", use_dora=True)
    with pytest.raises(LoraConversionError, match="DoRA"):
        convert(dora, base_model, tmp_path / "dora.gguf")
    assert not list(tmp_path.glob("*.gguf*"))


def test_rslora_keeps_its_scale(tmp_path: Path) -> None:
    from kernel_lsp.services.lora_gguf import read_config

    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 16, "lora_alpha": 8,
                                                              "use_rslora": True}))
    rank, alpha = read_config(tmp_path)
    # rsLoRA scales by alpha / sqrt(r), llama.cpp by alpha / r: the alpha written is 8 * sqrt(16).
    assert rank == 16 and alpha / rank == pytest.approx(8 / 16**0.5)


@pytest.mark.model
@pytest.mark.timeout(900)
def test_the_editor_loads_the_adapter_over_the_05b_and_runs_the_planner(base_model: Path, tmp_path: Path) -> None:
    from kernel_lsp.services.llm import LlamaModel, LoadOptions, llama_available

    if not llama_available():
        pytest.skip("llama-cpp-python is not installed (pip install 'kernel-lsp[model]')")
    from kernel_lsp.config import Settings
    from kernel_lsp.core.candidates import OptimizeRequest
    from kernel_lsp.services.llm import model_from_settings
    from kernel_lsp.services.model_jobs import JobBudgets, ModelJobs

    adapter = convert(write_adapter(tmp_path / "adapter", scale=0.5), base_model, tmp_path / "adapter.gguf",
                      dtype="f16").path
    question = [{"role": "user", "content": "Name one CUDA memory space, in one word."}]
    plain = LlamaModel(base_model, LoadOptions(n_ctx=1024, threads=2), name=MODEL)
    try:
        without = plain.chat(question, max_tokens=12, temperature=0.0, seed=0).text
    finally:
        plain.close()
    # The settings the editor reads (modelLora), through the loader the session uses.
    adapted = model_from_settings(Settings(model=MODEL, model_lora=str(adapter), model_n_ctx=4096, model_threads=2))
    try:
        with_adapter = adapted.chat(question, max_tokens=12, temperature=0.0, seed=0).text
        spec = {"kernel": "scale", "grid": ["(n+255)/256", 1, 1], "block": [256, 1, 1], "params": [
            {"name": "out", "array": "float32", "size": "n", "init": "zeros", "role": "out"},
            {"name": "in", "array": "float32", "size": "n", "init": "uniform(-1,1)", "role": "in"},
            {"name": "n", "scalar": "int32", "value": 1 << 20}]}
        source = ("__global__ void scale(float *out, const float *in, int n) {\n"
                  "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) out[i] = 2.0f * in[i];\n}\n"
                  "void launch(float *out, const float *in, int n) { scale<<<(n + 255) / 256, 256>>>(out, in, n); }\n")
        request = OptimizeRequest(source=source, path="scale.cu", kernel="scale", spec=spec)
        budgets = JobBudgets(planner_samples=1, planner_picks=1, editor_techniques=0, editor_samples=0,
                             repair_rounds=0, planner_max_tokens=48, max_seconds=600, turn_timeout_s=500)
        jobs = ModelJobs(adapted, budgets=budgets)
        list(jobs.generate(request))
    finally:
        adapted.close()
    print(f"without the adapter: {without!r}; with it: {with_adapter!r}")
    assert with_adapter != without
    assert jobs.stats["planner"].calls == 1
    [record] = [r for r in jobs.attempts if r.steps[0]["job"] == "planner"]
    assert any(step["kind"] == "model" for step in record.steps)
