"""The OpenAI-compatible endpoint backend against a small HTTP server in this process.

The server here answers like the two families met in practice: one that takes OpenAI's
``json_schema`` response format (llama-server, vLLM, Ollama) and one that refuses it
(llama-cpp-python's own server, with a 500 naming the field) and takes ``json_object`` with a ``schema`` (llama-cpp-python's own server).
``tests/model/test_endpoint_server.py`` runs the real llama-cpp-python server.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kernel_lsp.config import Settings
from kernel_lsp.services.llm import EndpointModel, ModelCancelled, ModelTimeout, model_from_settings
from kernel_lsp.services.models import ModelError

SCHEMA = {"type": "object", "properties": {"choice": {"enum": ["a", "b"]}}, "required": ["choice"]}


class FakeServer:
    def __init__(self, *, accepts_json_schema: bool = True, delay_s: float = 0.0, props: dict | None = None):
        self.requests: list[dict] = []
        self.paths: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                outer.paths.append(self.path)
                if self.path == "/props" and props is not None:
                    self._send(200, props)
                else:
                    self._send(404, {"error": "not found"})

            def do_POST(self):
                outer.paths.append(self.path)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                kind = (body.get("response_format") or {}).get("type")
                if kind == "json_schema" and not accepts_json_schema:
                    # What llama-cpp-python 0.3's server answers: a 500 naming the field.
                    self._send(500, {"error": {"message": "1 validation error: ('body', 'response_format', 'type') "
                                                          "Input should be 'text' or 'json_object'"}})
                    return
                time.sleep(delay_s)
                self._send(200, {"choices": [{"message": {"role": "assistant", "content": '{"choice": "b"}'},
                                              "finish_reason": "stop"}],
                                 "usage": {"prompt_tokens": 11, "completion_tokens": 5}})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # A client that gave up (the timeout test) leaves a broken pipe behind; that is expected here.
        self.httpd.handle_error = lambda request, address: None
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(request):
    made = []

    def make(**kw):
        made.append(FakeServer(**kw))
        return made[-1]

    yield make
    for s in made:
        s.close()


def test_the_schema_goes_as_openais_json_schema_response_format(server):
    fake = server()
    model = EndpointModel(fake.url + "/v1", model="coder-32b")
    reply = model.chat([{"role": "user", "content": "pick"}], schema=SCHEMA, max_tokens=16, temperature=0.3, seed=7)
    assert reply.text == '{"choice": "b"}' and (reply.prompt_tokens, reply.completion_tokens) == (11, 5)
    body = fake.requests[0]
    assert fake.paths == ["/v1/chat/completions"]
    assert body["model"] == "coder-32b" and body["seed"] == 7 and body["max_tokens"] == 16
    assert body["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "reply", "schema": SCHEMA, "strict": True}}


def test_a_server_that_refuses_json_schema_gets_json_object_with_the_schema_from_then_on(server):
    fake = server(accepts_json_schema=False)
    model = EndpointModel(fake.url)  # "/v1" is added
    model.chat([{"role": "user", "content": "pick"}], schema=SCHEMA)
    model.chat([{"role": "user", "content": "again"}], schema=SCHEMA)
    kinds = [r["response_format"]["type"] for r in fake.requests]
    assert kinds == ["json_schema", "json_object", "json_object"]
    assert fake.requests[-1]["response_format"]["schema"] == SCHEMA


def test_timeout_and_cancel_return_without_waiting_for_the_server(server):
    fake = server(delay_s=3.0)
    model = EndpointModel(fake.url)
    start = time.monotonic()
    with pytest.raises(ModelTimeout):
        model.chat([{"role": "user", "content": "slow"}], timeout_s=0.3)
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    with pytest.raises(ModelCancelled):
        model.chat([{"role": "user", "content": "slow"}], timeout_s=30, cancel=cancel)
    assert time.monotonic() - start < 2.5


def test_no_server_and_other_schemes_are_model_errors():
    with pytest.raises(ModelError, match="http:// or https://"):
        EndpointModel("file:///etc/passwd")
    model = EndpointModel("http://127.0.0.1:9")  # the discard port: nothing listens
    with pytest.raises(ModelError):
        model.chat([{"role": "user", "content": "x"}], timeout_s=5)


def test_the_tool_format_comes_from_the_servers_template_when_it_shows_one(server):
    template = "{% for m in messages %}{% if m.tool_calls %}<tool_call>{% elif m.role == 'tool' %}r{% endif %}{% endfor %}"
    shown = server(props={"chat_template": template})
    assert EndpointModel(shown.url).tool_format.supports_tools
    hidden = server()
    assert not EndpointModel(hidden.url).tool_format.supports_tools
    assert hidden.paths == ["/props"]


def test_settings_choose_the_endpoint_over_a_gguf():
    model = model_from_settings(Settings(model="coder", model_endpoint="http://127.0.0.1:8080/v1"))
    assert isinstance(model, EndpointModel) and model.base_url == "http://127.0.0.1:8080/v1" and model.model == "coder"
    assert model_from_settings(Settings()) is None
