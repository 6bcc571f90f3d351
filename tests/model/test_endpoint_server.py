"""The endpoint backend against a real OpenAI-compatible server: llama-cpp-python's own
(``python -m llama_cpp.server``, the ``server`` extra) serving the 0.5B GGUF on 127.0.0.1.

Skipped, with the reason, when the server's packages or the model are missing. Kept short:
two threads, n_ctx 2048, answers of a few tokens (that server checks the grammar against the
whole vocabulary at every token, so long constrained answers are slow on a CPU).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from kernel_lsp.core.candidates import OptimizeRequest
from kernel_lsp.core.rules import RuleGenerator
from kernel_lsp.services import models
from kernel_lsp.services.llm import EndpointModel
from kernel_lsp.services.model_jobs import JobBudgets, ModelJobs, build_menu, planner_schema

MODEL = "qwen2.5-coder-0.5b-instruct-q4_k_m"
START_TIMEOUT_S = 240.0

pytestmark = pytest.mark.model

SOURCE = """__global__ void scale(float *out, const float *in, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * in[i];
}
"""
SPEC = {
    "kernel": "scale",
    "params": [
        {"name": "out", "array": "float32", "size": "n", "init": "zeros", "role": "out"},
        {"name": "in", "array": "float32", "size": "n", "init": "uniform(-1,1)", "role": "in"},
        {"name": "a", "scalar": "float32", "value": 2.0},
        {"name": "n", "scalar": "int32", "value": 1 << 20},
    ],
    "grid": ["(n+255)/256", 1, 1],
    "block": [256, 1, 1],
}


def _missing() -> str | None:
    for module in ("llama_cpp", "uvicorn", "fastapi", "sse_starlette", "starlette_context", "pydantic_settings"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install 'kernel-lsp[model]', which has llama-cpp-python[server])"
    spec = models.find_model(MODEL, models.load_manifest())
    if not models.is_installed(spec):
        return f"{MODEL} is not installed (kernel-lsp models install {MODEL})"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    why = _missing()
    if why:
        pytest.skip(why)
    path = models.installed_path(models.find_model(MODEL, models.load_manifest()))
    port = _free_port()
    argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(path), "--host", "127.0.0.1", "--port", str(port),
            "--n_threads", "2", "--n_ctx", "2048", "--verbose", "False"]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while True:
            if process.poll() is not None:
                pytest.fail(f"the server exited ({process.returncode}): {process.stderr.read().decode()[-2000:]}")
            try:
                with urllib.request.urlopen(url + "/v1/models", timeout=2) as reply:
                    listed = json.load(reply)
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"the server did not answer within {START_TIMEOUT_S:.0f} s")
                time.sleep(1.0)
        yield url, listed
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(20)


def test_a_constrained_answer_comes_back_through_the_endpoint(server):
    url, listed = server
    served = listed["data"][0]["id"]
    model = EndpointModel(url + "/v1", model=served)
    schema = {"type": "object", "properties": {"choice": {"type": "string", "enum": ["tiled", "unrolled"]}},
              "required": ["choice"], "additionalProperties": False}
    reply = model.chat([{"role": "system", "content": "Answer with JSON."},
                        {"role": "user", "content": "Which is a loop optimization: tiled or unrolled?"}],
                       schema=schema, max_tokens=16, temperature=0.0, seed=1, timeout_s=240)
    assert json.loads(reply.text)["choice"] in ("tiled", "unrolled")
    assert reply.prompt_tokens > 10 and reply.completion_tokens > 0
    # llama-cpp-python's server refused OpenAI's json_schema form; the json_object form with the schema served.
    assert model._schema_style == "json_object"


def test_the_planner_job_runs_on_the_server(server):
    url, listed = server
    model = EndpointModel(url + "/v1", model=listed["data"][0]["id"])
    request = OptimizeRequest(source=SOURCE, path="scale.cu", kernel="scale", spec=SPEC)
    ids = [e.id for e in build_menu(list(RuleGenerator().generate(request)))]
    jobs = ModelJobs(model, budgets=JobBudgets(planner_samples=1, editor_samples=0, planner_max_tokens=40,
                                               turn_timeout_s=240))
    candidates = list(jobs.generate(request))
    assert jobs.stats["planner"].calls == 1 and jobs.stats["planner"].tokens > 0
    assert jobs.plan is not None and set(jobs.plan.ranked) <= set(ids)
    # Every rule candidate is still offered, the planner's choice (if it finished its answer) first.
    assert sorted(jobs.order) == sorted(ids) and len(candidates) >= len(ids)
    if jobs.plan.ranked:
        assert jobs.order[0] == jobs.plan.ranked[0]
    assert planner_schema(ids)["properties"]["choice"]["enum"] == ids
