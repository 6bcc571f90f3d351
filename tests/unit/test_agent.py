"""The model's reasoning loop, driven by a scripted model (no llama.cpp)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from kernel_lsp.core.candidates import OptimizeRequest, TechniqueHint
from kernel_lsp.services.agent import (
    AgentBudgets,
    AgentTools,
    CompileFeedback,
    FinalAnswer,
    InvalidReply,
    ModelGenerator,
    ToolCall,
    attempt_id_of,
    find_kernel,
    parse_reply,
    reply_schema,
    splice_kernel,
    view_file,
)
from kernel_lsp.services.llm import ModelTimeout
from scripted_model import ScriptedModel

SOURCE = """#include <cuda_runtime.h>

// scale: out = a * in
__global__ void scale(float *out, const float *in, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * in[i];
}

void launch(float *out, const float *in, float a, int n) {
    scale<<<(n + 255) / 256, 256>>>(out, in, a, n);
}
"""

GRID_STRIDE = """__global__ void scale(float *__restrict__ out, const float *__restrict__ in, float a, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[i] = a * in[i];
}"""

HINT = TechniqueHint(
    name="grid_stride_loop",
    description="Loop over the index space with a grid-sized stride.",
    predicted_speedup=1.2,
    confidence=0.5,
    example_before="__global__ void k(float *x, int n) { int i = threadIdx.x; if (i < n) x[i] = 0; }",
    example_after="__global__ void k(float *x, int n) { for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] = 0; }",
)


def request(**changes) -> OptimizeRequest:
    base = dict(
        source=SOURCE,
        path="scale.cu",
        kernel="scale",
        spec=None,
        profile_summary="dram 12% of peak; 96% of stalls are long scoreboard",
        state="memory_latency_bound",
        techniques=(HINT,),
    )
    base.update(changes)
    return OptimizeRequest(**base)


def final(kernel_source: str, technique: str = "grid_stride_loop", explanation: str = "grid-stride loop") -> str:
    return json.dumps({"final": {"technique": technique, "explanation": explanation, "kernel_source": kernel_source}})


def tool(name: str, **args) -> str:
    return json.dumps({"tool": name, "args": args})


def one_sample(**changes) -> AgentBudgets:
    return AgentBudgets(**{"samples_per_technique": 1, **changes})


class FakeCompiler:
    """Rejects any file containing BUG, as nvcc would reject an undeclared name."""

    def __init__(self):
        self.sources: list[str] = []

    def __call__(self, source: str) -> CompileFeedback:
        self.sources.append(source)
        if "BUG" in source:
            return CompileFeedback(False, 'scale.cu(5): error: identifier "BUG" is undefined')
        return CompileFeedback(True, "ptxas info: Used 10 registers, 0 bytes smem")


def test_final_answer_is_spliced_into_the_file():
    model = ScriptedModel([final(GRID_STRIDE)])
    gen = ModelGenerator(model, AgentTools(compile=FakeCompiler()), one_sample())
    [candidate] = list(gen.generate(request()))
    assert candidate.generator == "model:scripted"
    assert candidate.technique == "grid_stride_loop"
    assert GRID_STRIDE in candidate.source
    assert "if (i < n) out[i] = a * in[i];" not in candidate.source
    # The host code and the comment above the kernel are untouched.
    assert candidate.source.startswith("#include <cuda_runtime.h>\n\n// scale: out = a * in\n")
    assert candidate.source.endswith(SOURCE[SOURCE.index("void launch") :])
    assert attempt_id_of(candidate) == gen.attempts[0].attempt_id
    assert gen.attempts[0].outcome == "candidate"


def test_prompt_carries_profile_technique_and_example():
    model = ScriptedModel([final(GRID_STRIDE)])
    list(ModelGenerator(model, AgentTools(), one_sample()).generate(request(spec={"grid": [4]})))
    user = model.calls[0].messages[1]["content"]
    assert "long scoreboard" in user
    assert "memory_latency_bound" in user
    assert "grid_stride_loop: Loop over the index space" in user
    assert HINT.example_before in user and HINT.example_after in user
    assert "if (i < n) out[i] = a * in[i];" in user
    assert '"grid": [4]' in user
    # The worked example comes before the user's kernel: small models follow what they read last.
    assert user.index(HINT.example_after) < user.index("if (i < n) out[i] = a * in[i];")
    assert "keep the kernel name scale" in model.calls[0].messages[0]["content"]


def test_tool_calls_are_dispatched_and_results_fed_back(tmp_path: Path):
    (tmp_path / "scale.cu").write_text(SOURCE)
    benchmarked, searched = [], []
    tools = AgentTools(
        compile=FakeCompiler(),
        benchmark=lambda src: benchmarked.append(src) or "correct, 1.31x faster",
        profile=lambda: "PROFILE-TEXT",
        kb_search=lambda q: searched.append(q) or "vectorized_loads: use float4",
        workspace_root=str(tmp_path),
    )
    model = ScriptedModel(
        [
            tool("profile"),
            tool("view_file", path="scale.cu", start_line=4),
            tool("kb_search", query="latency"),
            tool("compile", kernel_source=GRID_STRIDE),
            tool("benchmark", kernel_source=GRID_STRIDE),
            final(GRID_STRIDE),
        ]
    )
    gen = ModelGenerator(model, tools, one_sample(max_steps=6))
    [candidate] = list(gen.generate(request()))
    feedback = [call.messages[-1]["content"] for call in model.calls[1:]]
    assert feedback[0] == "Result of profile:\nPROFILE-TEXT"
    assert feedback[1].startswith("Result of view_file:\nscale.cu, lines 4-11 of 11:\n    4  __global__ void scale")
    assert "vectorized_loads" in feedback[2] and searched == ["latency"]
    assert "Used 10 registers" in feedback[3]
    assert feedback[4] == "Result of benchmark:\ncorrect, 1.31x faster"
    assert benchmarked == [candidate.source]
    kinds = [step["kind"] for step in candidate.trace]
    assert kinds.count("tool") == 5 and kinds[0] == "attempt"


def test_only_offered_tools_are_in_the_schema_and_accepted():
    schema = reply_schema(("compile", "view_file"))
    tools = [v["properties"]["tool"]["const"] for v in schema["oneOf"] if "tool" in v["properties"]]
    assert tools == ["compile", "view_file"]
    assert isinstance(parse_reply(tool("benchmark", kernel_source="x"), ("compile",)), InvalidReply)
    model = ScriptedModel([tool("benchmark", kernel_source=GRID_STRIDE), final(GRID_STRIDE)])
    gen = ModelGenerator(model, AgentTools(), one_sample())
    assert len(list(gen.generate(request(profile_summary=None, techniques=())))) == 1
    assert "unknown tool 'benchmark'" in model.calls[1].messages[-1]["content"]


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"tool": "view_file", "args": {"path": "a.cu", "start_line": 3}}', ToolCall("view_file", {"path": "a.cu", "start_line": 3})),
        ('Sure!\n```json\n{"final": {"kernel_source": "k"}}\n```', FinalAnswer("k", "", "")),
        ('{"tool": "view_file", "args": {"path": "a.cu", "start_line": "3"}}', InvalidReply("tool view_file needs args.start_line (integer)")),
        ('{"tool": "compile", "args": {"kernel_source": ', None),
        ('{"final": {"kernel_source": "__global__ void k() {\n  return;\n}"}}', FinalAnswer("__global__ void k() {\n  return;\n}", "", "")),
        ("I would tile the kernel.", InvalidReply("the reply has no JSON object")),
        ('{"final": {"kernel_source": "  "}}', InvalidReply('"kernel_source" is empty')),
        ('{"answer": 1}', InvalidReply('expected {"tool": ..., "args": ...} or {"final": ...}')),
        ("[1, 2]", None),
    ],
)
def test_parse_reply(text, expected):
    parsed = parse_reply(text, ("compile", "view_file"))
    if expected is None:
        assert isinstance(parsed, InvalidReply)
    else:
        assert parsed == expected


def test_malformed_json_is_fed_back_and_the_loop_goes_on():
    model = ScriptedModel(['{"final": {"kernel_source": "__global__ void scale(', final(GRID_STRIDE)])
    gen = ModelGenerator(model, AgentTools(), one_sample())
    assert len(list(gen.generate(request()))) == 1
    assert model.calls[1].messages[-1]["content"].startswith("Invalid reply: the reply is not valid JSON")
    assert [s["kind"] for s in gen.attempts[0].steps][:2] == ["model", "invalid"]


def test_a_cut_off_reply_is_reported_as_such():
    model = ScriptedModel(['{"final": {"kernel_source": "__global__'], finish_reason="length")
    gen = ModelGenerator(model, AgentTools(), one_sample(max_steps=1))
    assert list(gen.generate(request())) == []
    assert "cut off" in gen.attempts[0].steps[1]["why"]


def test_compile_errors_go_back_for_repair():
    broken = GRID_STRIDE.replace("a * in[i]", "a * in[i] + BUG")
    compiler = FakeCompiler()
    model = ScriptedModel([final(broken), final(GRID_STRIDE)])
    gen = ModelGenerator(model, AgentTools(compile=compiler), one_sample())
    [candidate] = list(gen.generate(request()))
    assert "BUG" not in candidate.source
    assert len(compiler.sources) == 2
    repair = model.calls[1].messages[-1]["content"]
    assert repair.startswith("The compiler rejected your kernel:") and 'identifier "BUG" is undefined' in repair
    assert [s["ok"] for s in candidate.trace if s["kind"] == "compile"] == [False, True]


def test_repairs_are_bounded():
    broken = final(GRID_STRIDE.replace("a * in[i]", "BUG"))
    model = ScriptedModel([broken, broken, broken, final(GRID_STRIDE)])
    gen = ModelGenerator(model, AgentTools(compile=FakeCompiler()), one_sample(max_repairs=1))
    assert list(gen.generate(request())) == []
    assert model.remaining == 2
    record = gen.attempts[0]
    assert record.outcome == "rejected"
    assert record.reason == 'does not compile after 1 repair(s): scale.cu(5): error: identifier "BUG" is undefined'


def test_renamed_kernel_or_changed_parameters_are_refused_with_a_reason():
    renamed = GRID_STRIDE.replace("void scale(", "void scale_tiled(")
    fewer = GRID_STRIDE.replace(", int n)", ")")
    model = ScriptedModel([final(renamed), final(fewer), final(GRID_STRIDE)])
    gen = ModelGenerator(model, AgentTools(), one_sample())
    assert len(list(gen.generate(request()))) == 1
    assert "no __global__ function named scale (it defines scale_tiled)" in model.calls[1].messages[-1]["content"]
    assert "the parameter list changed" in model.calls[2].messages[-1]["content"]


def test_splice_keeps_needed_helpers_and_drops_duplicates_and_host_code():
    answer = (
        "```cuda\n#include <cuda_runtime.h>\n#define TILE 32\n"
        "__global__ void scale(float *out, const float *in, float a, int n) { out[0] = TILE * a; }\n"
        "void launch(float *out, const float *in, float a, int n) {}\nint main() { return 0; }\n```"
    )
    result = splice_kernel(SOURCE, "scale", answer)
    assert result.error is None
    assert result.source.count("#include <cuda_runtime.h>") == 1
    assert result.source.count("void launch(") == 1
    assert "int main" not in result.source
    assert "#define TILE 32\n\n__global__ void scale" in result.source
    assert "dropped text after the kernel (host code is not replaced)" in result.notes


def test_splice_handles_templates_launch_bounds_and_comments():
    source = (
        '// __global__ void scale(int) { "fake" }\n'
        "template <int B>\n__global__ void __launch_bounds__(B) scale(float *x, int n) {\n"
        '  const char *s = "}"; /* { */ x[0] = n;\n}\nint main() { scale<64><<<1, 64>>>(0, 0); }\n'
    )
    span = find_kernel(source, "scale").span
    start, end = span.start_byte, span.end_byte  # the source is ASCII: byte offsets are str offsets
    assert source[start:end].startswith("template <int B>\n__global__")
    assert source[start:end].endswith("x[0] = n;\n}")
    new = "template <int B>\n__global__ void __launch_bounds__(B) scale(float *__restrict__ x, int count) { x[1] = count; }"
    result = splice_kernel(source, "scale", new)
    assert result.source == source[:start] + new + source[end:]


def test_splice_replaces_extern_c_kernels_whole_and_keeps_utf8_text():
    source = '// größe\nextern "C" __global__ void scale(float *x, int n) { x[0] = n; }\nint main() {}\n'
    new = 'extern "C" __global__ void scale(float *__restrict__ x, int n) { x[1] = n; }'
    result = splice_kernel(source, "scale", new)
    assert result.error is None
    assert result.source == '// größe\n' + new + "\nint main() {}\n"


def test_splice_drops_a_repeated_device_helper():
    source = "__device__ float twice(float v) { return 2 * v; }\n" + SOURCE
    answer = ("__device__ float twice(float v) { return 2 * v; }\n"
              "__global__ void scale(float *out, const float *in, float a, int n) { out[0] = twice(a); }")
    result = splice_kernel(source, "scale", answer)
    assert result.error is None and result.source.count("float twice(") == 1
    assert "dropped a second definition of twice" in result.notes


def test_double_escaped_newlines_are_undone():
    result = splice_kernel(SOURCE, "scale", GRID_STRIDE.replace("\n", "\\n"))
    assert GRID_STRIDE in result.source


def test_unchanged_kernel_is_not_a_candidate():
    original = SOURCE[SOURCE.index("__global__") : SOURCE.index("void launch")].strip()
    model = ScriptedModel([final(original), final(GRID_STRIDE)])
    gen = ModelGenerator(model, AgentTools(), one_sample())
    assert len(list(gen.generate(request()))) == 1
    assert "unchanged" in model.calls[1].messages[-1]["content"]
    assert [call.temperature for call in model.calls] == [0.2, pytest.approx(0.6)]


def test_samples_vary_temperature_and_seed_and_duplicates_are_dropped():
    second = GRID_STRIDE.replace("out[i] = a * in[i];", "out[i] = in[i] * a;")
    other = TechniqueHint("vectorized_loads", "use float4", 1.5, 0.4)
    model = ScriptedModel([final(GRID_STRIDE), final(GRID_STRIDE), final(second), final(GRID_STRIDE)])
    budgets = AgentBudgets(samples_per_technique=2, temperatures=(0.1, 0.9), seed=7)
    gen = ModelGenerator(model, AgentTools(), budgets)
    candidates = list(gen.generate(request(techniques=(HINT, other))))
    assert [c.technique for c in candidates] == ["grid_stride_loop", "vectorized_loads"]
    assert [(c.temperature, c.seed) for c in model.calls] == [(0.1, 7), (0.9, 107), (0.1, 1007), (0.9, 1107)]
    assert [a.reason for a in gen.attempts] == [None, "same file as an earlier candidate", None, "same file as an earlier candidate"]
    assert "Rewrite scale with vectorized_loads" in model.calls[2].messages[1]["content"]


def test_step_budget_ends_an_attempt():
    model = ScriptedModel([tool("profile")] * 3)
    gen = ModelGenerator(model, AgentTools(), one_sample(max_steps=3))
    assert list(gen.generate(request())) == []
    assert gen.attempts[0].reason == "no usable final answer within 3 turns"
    assert gen.stop_reason is None


def test_token_budget_stops_generation():
    # Every scripted reply costs its words; the budget runs out after the first attempt.
    model = ScriptedModel([final(GRID_STRIDE), final(GRID_STRIDE.replace("a * in[i]", "in[i] * a"))])
    budgets = AgentBudgets(samples_per_technique=2, max_total_tokens=50)
    gen = ModelGenerator(model, AgentTools(), budgets)
    candidates = list(gen.generate(request()))
    assert len(candidates) == 1
    assert gen.stop_reason is not None and gen.stop_reason.startswith("token budget spent")
    assert len(model.calls) == 1
    assert gen.prompt_tokens + gen.completion_tokens >= 50


def test_time_budget_stops_generation():
    now = [0.0]

    def clock() -> float:
        now[0] += 4.0  # each look at the clock costs 4 s of fake time
        return now[0]

    model = ScriptedModel([tool("profile")] * 10)
    gen = ModelGenerator(model, AgentTools(), one_sample(max_seconds=20.0, max_steps=10), clock=clock)
    assert list(gen.generate(request())) == []
    assert gen.stop_reason == "time budget spent (20 s)"
    assert len(model.calls) < 10


def test_cancel_stops_generation():
    cancel = threading.Event()

    def reply(_messages):
        cancel.set()
        return tool("profile")

    model = ScriptedModel([reply, tool("profile")])
    gen = ModelGenerator(model, AgentTools(), one_sample(), cancel=cancel)
    assert list(gen.generate(request())) == []
    assert gen.stop_reason == "cancelled" and len(model.calls) == 1


def test_model_failure_ends_the_attempt_not_the_generation():
    model = ScriptedModel([ModelTimeout("the model took longer than 1 s"), final(GRID_STRIDE)])
    gen = ModelGenerator(model, AgentTools(), one_sample(samples_per_technique=2))
    assert len(list(gen.generate(request()))) == 1
    assert gen.attempts[0].reason == "model error: the model took longer than 1 s"


def test_a_failing_tool_becomes_text_for_the_model():
    def broken_benchmark(_source):
        raise RuntimeError("GPU runner crashed")

    model = ScriptedModel([tool("benchmark", kernel_source=GRID_STRIDE), final(GRID_STRIDE)])
    gen = ModelGenerator(model, AgentTools(benchmark=broken_benchmark), one_sample())
    assert len(list(gen.generate(request()))) == 1
    assert "the tool failed: RuntimeError: GPU runner crashed" in model.calls[1].messages[-1]["content"]


def test_long_tool_results_are_cut_and_old_turns_dropped():
    model = ScriptedModel([tool("profile")] * 4 + [final(GRID_STRIDE)])
    gen = ModelGenerator(
        model, AgentTools(profile=lambda: "x" * 5000), one_sample(max_steps=5, tool_result_chars=100, keep_exchanges=1)
    )
    list(gen.generate(request()))
    last = model.calls[-1].messages
    assert len(last) == 4  # system, task, and one (reply, result) exchange
    assert last[-1]["content"].endswith("... (4900 more characters)")


def test_traces_reach_the_sink():
    records = []
    model = ScriptedModel(["not json", final(GRID_STRIDE)])
    gen = ModelGenerator(model, AgentTools(), one_sample(), trace_sink=records.append)
    list(gen.generate(request()))
    [record] = records
    assert record.prompt[0]["role"] == "system" and record.prompt[1]["role"] == "user"
    assert [s["kind"] for s in record.steps] == ["model", "invalid", "model"]
    assert record.candidate_source is not None and GRID_STRIDE in record.candidate_source
    assert record.completion_tokens == 2 + len(final(GRID_STRIDE).split())


def test_missing_kernel_yields_nothing():
    gen = ModelGenerator(ScriptedModel([]), AgentTools(), one_sample())
    assert list(gen.generate(request(kernel="nope"))) == []
    assert gen.stop_reason == "no __global__ function named nope in scale.cu"


# --- view_file sandbox ---


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "src" / "k.cu").write_text("".join(f"line {i}\n" for i in range(1, 251)))
    (tmp_path / "secret.txt").write_text("top secret\n")
    return root


def test_view_file_shows_at_most_100_numbered_lines(workspace: Path):
    text = view_file(str(workspace), "src/k.cu", 120)
    lines = text.splitlines()
    assert lines[0] == "src/k.cu, lines 120-219 of 250:"
    assert lines[1] == "  120  line 120" and lines[-1] == "  219  line 219"
    assert len(lines) == 101
    assert view_file(str(workspace), str(workspace / "src" / "k.cu"), 250).endswith("250  line 250")
    assert view_file(str(workspace), "src/k.cu", 400) == "error: src/k.cu has only 250 lines"


@pytest.mark.parametrize("path", ["../secret.txt", "src/../../secret.txt", "/etc/passwd", "", "src/k.cu\x00"])
def test_view_file_refuses_paths_outside_the_workspace(workspace: Path, path: str):
    text = view_file(str(workspace), path, 1)
    assert text.startswith("error:")
    assert "top secret" not in text and "root:" not in text


def test_view_file_refuses_symlinks_that_escape(workspace: Path):
    os.symlink(workspace.parent / "secret.txt", workspace / "link.txt")
    os.symlink(workspace.parent, workspace / "up")
    assert view_file(str(workspace), "link.txt", 1) == "error: link.txt is outside the workspace"
    assert view_file(str(workspace), "up/secret.txt", 1) == "error: up/secret.txt is outside the workspace"
    os.symlink(workspace / "src" / "k.cu", workspace / "inside.cu")
    assert "line 1" in view_file(str(workspace), "inside.cu", 1)


def test_view_file_not_offered_without_a_workspace():
    gen = ModelGenerator(ScriptedModel([]), AgentTools())
    assert "view_file" not in gen.available_tools(request())
    assert view_file(None, "a.cu") == "error: no workspace is open, so view_file is not available"
