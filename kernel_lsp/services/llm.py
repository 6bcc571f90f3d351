"""The model host: llama-cpp-python in a worker process, behind a small chat interface.

The GGUF is loaded lazily, on the first request, in a child process started with
``multiprocessing``'s *spawn* method: a long generation, a crash inside llama.cpp
or an out-of-memory kill takes down the worker, never the language server, and a
request that outlives its timeout (or is cancelled) kills the worker; the next
request starts a fresh one. Output is constrained to a JSON schema through a
llama.cpp grammar, so a small model cannot answer with anything but JSON of the
requested shape (it can still be cut off by ``max_tokens``: callers check
``finish_reason``). No chat format is named: llama-cpp-python renders with the
template in the GGUF's metadata (``tokenizer.chat_template``), and the worker
reports it so the model jobs know whether it renders tool calls
(:mod:`kernel_lsp.core.chat_template`). A LoRA adapter in GGUF may be loaded over
the model (``modelLora``).

:class:`EndpointModel` is the same interface over any OpenAI-compatible local
server (llama.cpp's ``llama-server``, llama-cpp-python's own server, Ollama,
vLLM): a user with a GPU serves a large coder model there and sets
``modelEndpoint``. The schema goes as ``response_format`` (OpenAI's
``json_schema`` form, or the ``json_object`` form with a ``schema`` that
llama-cpp-python's server takes, whichever the server accepts).

:class:`ChatModel` is the interface the agent and the model jobs use;
``tests/unit/scripted_model.py`` is the test double.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import math
import multiprocessing
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernel_lsp.core.chat_template import PLAIN, ToolFormat, arguments_as_objects, tool_format
from kernel_lsp.services.models import ModelError, check_gguf, resolve_model

#: How long loading a GGUF may take before the worker is killed, in seconds.
LOAD_TIMEOUT_S = 300.0
_POLL_S = 0.05
_INSTALL_HINT = "llama-cpp-python is not installed; install it with: pip install 'kernel-lsp[model]'"


class ModelTimeout(ModelError):
    """A request took longer than its timeout; the worker was killed."""


class ModelCancelled(ModelError):
    """A request was cancelled; the worker was killed."""


@dataclass(frozen=True)
class Completion:
    text: str
    finish_reason: str | None
    """``stop`` (a complete answer) or ``length`` (cut off at max_tokens)."""
    prompt_tokens: int
    completion_tokens: int
    wall_s: float


@dataclass(frozen=True)
class ChatRequest:
    """What one :meth:`ChatModel.chat` call asks for (the messages copied, so later edits do not change it)."""

    messages: tuple[Mapping[str, Any], ...]
    """Chat messages; an assistant message may carry ``tool_calls`` and a ``tool`` message answers one."""
    schema: Mapping[str, Any] | None
    max_tokens: int
    temperature: float
    seed: int | None


class ChatModel(ABC):
    """The interface the agent uses: :meth:`chat` takes the arguments once, implementations answer a :class:`ChatRequest`."""

    name: str

    @property
    def tool_format(self) -> ToolFormat:
        """Whether the model's chat template renders tool calls (unknown: plain messages)."""
        return PLAIN

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        schema: Mapping[str, Any] | None = None,
        max_tokens: int = 512,
        temperature: float = 0.2,
        seed: int | None = None,
        timeout_s: float = 120.0,
        cancel: threading.Event | None = None,
    ) -> Completion:
        """One chat completion; ``schema`` (JSON schema) constrains the output. Raises ModelError."""
        request = ChatRequest(tuple(dict(m) for m in messages), schema, max_tokens, temperature, seed)
        return self._complete(request, timeout_s, cancel)

    @abstractmethod
    def _complete(self, request: ChatRequest, timeout_s: float, cancel: threading.Event | None) -> Completion: ...

    @abstractmethod
    def close(self) -> None: ...


def llama_available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


@dataclass(frozen=True)
class LoadOptions:
    n_gpu_layers: int = 0
    """Layers offloaded to the GPU (0: CPU only)."""
    n_ctx: int = 8192
    """Context size in tokens."""
    threads: int | None = None
    """CPU threads (None: llama.cpp's default)."""
    lora_path: str | None = None
    """A LoRA adapter in GGUF applied over the model (None: the model as it is)."""


class LlamaModel(ChatModel):
    """A GGUF served by llama-cpp-python in a spawned worker process (thread-safe, one request at a time)."""

    def __init__(self, path: str | Path, options: LoadOptions = LoadOptions(), name: str | None = None):
        self.path = Path(path)
        self.options = options
        self.name = name or self.path.stem
        self.load_s: float | None = None
        """Seconds the last worker took to load the model (None before the first load)."""
        self.chat_template: str | None = None
        """The chat template llama.cpp renders with, from the GGUF's metadata (None before the first load)."""
        self.chat_format: str | None = None
        """llama-cpp-python's name for how it renders (``chat_template.default``: the GGUF's template)."""
        self.prompt_tokens_total = 0
        self.completion_tokens_total = 0
        self._lock = threading.Lock()
        self._process: multiprocessing.process.BaseProcess | None = None
        self._conn: Any = None

    # -- lifecycle ---------------------------------------------------------------

    def _ensure_worker(self, cancel: threading.Event | None) -> None:
        if self._process is not None and self._process.is_alive():
            return
        self._stop_worker()
        if not llama_available():
            raise ModelError(_INSTALL_HINT)
        check_gguf(self.path)
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        process = ctx.Process(
            target=_worker_main,
            args=(child, str(self.path), self.options.n_gpu_layers, self.options.n_ctx, self.options.threads,
                  self.options.lora_path),
            name=f"kernel-lsp-llm-{self.name}",
            daemon=True,
        )
        process.start()
        child.close()
        self._process, self._conn = process, parent
        reply = self._receive(LOAD_TIMEOUT_S, cancel, what="loading the model")
        if "error" in reply:
            self._stop_worker()
            raise ModelError(f"cannot load {self.path}: {reply['error']}")
        self.load_s = float(reply.get("load_s", 0.0))
        self.chat_template = reply.get("chat_template")
        self.chat_format = reply.get("chat_format")

    @property
    def tool_format(self) -> ToolFormat:
        return tool_format(self.chat_template, "gguf")

    def _stop_worker(self) -> None:
        process, self._process = self._process, None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if process is not None and process.is_alive():
            process.kill()
            process.join(5.0)

    def close(self) -> None:
        with self._lock:
            if self._process is not None and self._process.is_alive() and self._conn is not None:
                try:
                    self._conn.send({"op": "quit"})
                    self._process.join(2.0)
                except (OSError, EOFError):
                    pass
            self._stop_worker()

    # -- requests ---------------------------------------------------------------

    def _receive(self, timeout_s: float, cancel: threading.Event | None, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            if cancel is not None and cancel.is_set():
                self._stop_worker()
                raise ModelCancelled(f"cancelled while {what}")
            if time.monotonic() >= deadline:
                self._stop_worker()
                raise ModelTimeout(f"the model took longer than {timeout_s:.0f} s {what}; the worker was stopped")
            try:
                if self._conn.poll(_POLL_S):
                    return self._conn.recv()
            except (EOFError, OSError):
                pass
            else:
                continue
            code = self._process.exitcode if self._process is not None else None
            self._stop_worker()
            raise ModelError(f"the model worker died while {what} (exit code {code})")

    def _complete(self, request: ChatRequest, timeout_s: float, cancel: threading.Event | None) -> Completion:
        with self._lock:
            self._ensure_worker(cancel)
            start = time.monotonic()
            self._conn.send(
                {
                    "op": "chat",
                    "messages": [dict(m) for m in request.messages],
                    "schema": dict(request.schema) if request.schema is not None else None,
                    "max_tokens": request.max_tokens,
                    "temperature": request.temperature,
                    "seed": request.seed,
                }
            )
            reply = self._receive(timeout_s, cancel, what="generating")
            if "error" in reply:
                raise ModelError(f"generation failed: {reply['error']}")
            completion = Completion(
                text=reply["text"],
                finish_reason=reply.get("finish_reason"),
                prompt_tokens=int(reply.get("prompt_tokens") or 0),
                completion_tokens=int(reply.get("completion_tokens") or 0),
                wall_s=time.monotonic() - start,
            )
            self.prompt_tokens_total += completion.prompt_tokens
            self.completion_tokens_total += completion.completion_tokens
            return completion


def model_from_settings(settings: Any) -> ChatModel | None:
    """The model the settings name, or None when neither ``model`` nor ``modelEndpoint`` is set.

    ``modelEndpoint`` (an OpenAI-compatible server's URL) wins; ``model`` is then the name the server
    knows the model by. Otherwise ``model`` is a manifest name or a GGUF path, loaded with
    ``modelNGpuLayers``, ``modelNCtx``, ``modelThreads`` and the adapter ``modelLora``. Raises ModelError
    when the name is unknown, the model is not installed or a file is not a GGUF. Nothing is loaded or
    asked until the first request.
    """
    endpoint = getattr(settings, "model_endpoint", None)
    if endpoint:
        return EndpointModel(endpoint, model=settings.model)
    if not settings.model:
        return None
    path = resolve_model(settings.model)
    lora = getattr(settings, "model_lora", None)
    if lora:
        lora = str(Path(lora).expanduser())
        check_gguf(Path(lora))
    options = LoadOptions(
        n_gpu_layers=settings.model_n_gpu_layers, n_ctx=settings.model_n_ctx, threads=settings.model_threads,
        lora_path=lora,
    )
    given_a_path = path == Path(settings.model).expanduser()
    name = path.stem if given_a_path else settings.model
    return LlamaModel(path, options, name=name)


# --- an OpenAI-compatible server -------------------------------------------------

#: Longest reply body read from a server, in bytes (a reply is bounded by max_tokens; this bounds a bad server).
ENDPOINT_MAX_REPLY_BYTES = 8 * 1024 * 1024


class EndpointModel(ChatModel):
    """A model behind an OpenAI-compatible ``/v1/chat/completions`` (thread-safe, one request at a time).

    The request runs in a helper thread so that a timeout or a cancel returns at once; the server may go
    on generating that reply, which nobody reads.
    """

    def __init__(self, base_url: str, model: str | None = None, name: str | None = None):
        url = base_url.rstrip("/")
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            # urllib also opens file:// and ftp:// URLs; an endpoint is a server, nothing else.
            raise ModelError(f"modelEndpoint must be an http:// or https:// URL, not {url!r}")
        self.base_url = url if url.endswith("/v1") else url + "/v1"
        self.model = model
        self.name = name or model or "endpoint"
        self.prompt_tokens_total = 0
        self.completion_tokens_total = 0
        self._lock = threading.Lock()
        self._schema_style: str | None = None
        """``json_schema`` or ``json_object``: the response_format form this server took."""
        self._tool_format: ToolFormat | None = None

    @property
    def tool_format(self) -> ToolFormat:
        """From the server's chat template when it shows it (llama.cpp's ``/props``), else plain messages."""
        if self._tool_format is None:
            self._tool_format = PLAIN
            try:
                root = self.base_url[: -len("/v1")]
                props = self._request("GET", root + "/props", None, 10.0)
                self._tool_format = tool_format(str(props.get("chat_template") or "") or None, "server")
            except ModelError:
                pass
        return self._tool_format

    def close(self) -> None:
        """Nothing is held between requests."""

    def _request(self, method: str, url: str, body: Mapping[str, Any] | None, timeout_s: float) -> dict[str, Any]:
        data = json.dumps(body).encode("utf-8") if body is not None else None
        request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                raw = response.read(ENDPOINT_MAX_REPLY_BYTES + 1)
        except urllib.error.HTTPError as exc:
            detail = exc.read(2000).decode("utf-8", "replace")
            raise _HttpError(exc.code, f"{url}: HTTP {exc.code}: {detail}") from None
        except TimeoutError:
            raise ModelTimeout(f"{url}: no answer within {timeout_s:.0f} s") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise ModelError(f"{url}: {exc}") from None
        if len(raw) > ENDPOINT_MAX_REPLY_BYTES:
            raise ModelError(f"{url}: the reply is larger than {ENDPOINT_MAX_REPLY_BYTES} bytes")
        try:
            reply = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise ModelError(f"{url}: the reply is not JSON ({exc})") from None
        if not isinstance(reply, dict):
            raise ModelError(f"{url}: the reply is not a JSON object")
        return reply

    def _body(self, request: ChatRequest, style: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "messages": [dict(m) for m in request.messages],
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "stream": False,
        }
        if self.model:
            body["model"] = self.model
        if request.seed is not None:
            body["seed"] = request.seed
        if request.schema is not None:
            schema = dict(request.schema)
            if style == "json_object":
                body["response_format"] = {"type": "json_object", "schema": schema}
            else:
                body["response_format"] = {"type": "json_schema",
                                           "json_schema": {"name": "reply", "schema": schema, "strict": True}}
        return body

    def _post_chat(self, request: ChatRequest, timeout_s: float) -> dict[str, Any]:
        url = self.base_url + "/chat/completions"
        style = self._schema_style
        try:
            reply = self._request("POST", url, self._body(request, style), timeout_s)
        except _HttpError as exc:
            # A server that does not know OpenAI's json_schema form refuses the request (400 or 422; llama-cpp-
            # python's server answers 500 naming response_format); the json_object form with a schema is the
            # other one in use.
            refused = exc.code in (400, 422) or "response_format" in str(exc)
            if request.schema is None or style is not None or not refused:
                raise
            style = "json_object"
            reply = self._request("POST", url, self._body(request, style), timeout_s)
        if request.schema is not None and self._schema_style is None:
            self._schema_style = style or "json_schema"
        return reply

    def _complete(self, request: ChatRequest, timeout_s: float, cancel: threading.Event | None) -> Completion:
        with self._lock:
            start = time.monotonic()
            box: dict[str, Any] = {}

            def call() -> None:
                try:
                    # The socket waits a little longer than the deadline below, which decides.
                    box["reply"] = self._post_chat(request, timeout_s + 5.0)
                except ModelError as exc:
                    box["error"] = exc

            worker = threading.Thread(target=call, name=f"kernel-lsp-endpoint-{self.name}", daemon=True)
            worker.start()
            deadline = start + timeout_s
            while worker.is_alive():
                if cancel is not None and cancel.is_set():
                    raise ModelCancelled("cancelled while generating")
                if time.monotonic() >= deadline:
                    raise ModelTimeout(f"the server took longer than {timeout_s:.0f} s generating")
                worker.join(_POLL_S)
            if "error" in box:
                raise box["error"]
            reply = box["reply"]
            try:
                choice = reply["choices"][0]
                text = choice["message"].get("content") or ""
            except (KeyError, IndexError, TypeError, AttributeError):
                raise ModelError(f"the server's reply has no choices[0].message: {str(reply)[:300]}") from None
            usage = reply.get("usage") or {}
            completion = Completion(
                text=str(text),
                finish_reason=choice.get("finish_reason"),
                prompt_tokens=int(usage.get("prompt_tokens") or 0),
                completion_tokens=int(usage.get("completion_tokens") or 0),
                wall_s=time.monotonic() - start,
            )
            self.prompt_tokens_total += completion.prompt_tokens
            self.completion_tokens_total += completion.completion_tokens
            return completion


class _HttpError(ModelError):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


# --- the worker (runs in the spawned child) -----------------------------------


def _worker_main(conn: Any, path: str, n_gpu_layers: int, n_ctx: int, threads: int | None,
                 lora_path: str | None = None) -> None:
    """Load the GGUF, then answer ``{"op": "chat", ...}`` requests until ``quit`` or EOF."""
    start = time.monotonic()
    try:
        # Imported here, in the worker only: llama-cpp-python is an optional extra and loading it
        # in the server would cost its start-up time and memory even when no model is used.
        from llama_cpp import LlamaGrammar

        llm = _checked_grammar_llama_class()(
            model_path=path,
            n_gpu_layers=n_gpu_layers,
            n_ctx=n_ctx,
            n_threads=threads,
            lora_path=lora_path,
            verbose=False,
        )
    except ImportError:
        conn.send({"error": _INSTALL_HINT})
        return
    except Exception as exc:  # llama.cpp reports a bad file as ValueError/RuntimeError
        conn.send({"error": f"{type(exc).__name__}: {exc}"})
        return
    conn.send({"ready": True, "load_s": time.monotonic() - start,
               "chat_template": llm.metadata.get("tokenizer.chat_template"), "chat_format": llm.chat_format})
    grammars: dict[str, Any] = {}
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        if request.get("op") != "chat":
            return
        try:
            grammar = None
            if request["schema"] is not None:
                # Property order matters (the grammar fixes it), so the schema is passed as
                # given; only the cache key is canonical.
                key = json.dumps(request["schema"], sort_keys=True)
                if key not in grammars:
                    grammars[key] = LlamaGrammar.from_json_schema(json.dumps(request["schema"]), verbose=False)
                grammar = grammars[key]
            response = llm.create_chat_completion(
                messages=arguments_as_objects(request["messages"]),
                grammar=grammar,
                max_tokens=request["max_tokens"],
                temperature=request["temperature"],
                seed=request["seed"],
            )
            choice = response["choices"][0]
            usage = response.get("usage") or {}
            conn.send(
                {
                    "text": choice["message"]["content"] or "",
                    "finish_reason": choice.get("finish_reason"),
                    "prompt_tokens": usage.get("prompt_tokens"),
                    "completion_tokens": usage.get("completion_tokens"),
                }
            )
        except Exception as exc:  # an over-long prompt raises ValueError; report it, keep serving
            conn.send({"error": f"{type(exc).__name__}: {exc}"})


def _checked_grammar_llama_class() -> type:
    """llama_cpp.Llama whose grammar check runs on the chosen token first, not on the whole vocabulary.

    llama-cpp-python (0.3.x) puts the grammar sampler before top-k, so every token
    of the vocabulary (151k for Qwen2.5) is matched against the grammar at every
    step: measured here on the 0.5B model, 64 tokens took 71 s with the grammar
    against 14 s without. llama.cpp's own ``common_sampler_sample`` samples
    unconstrained, checks only the chosen token against the grammar and falls back
    to the full grammar pass when it is rejected; this does the same. The output
    still always satisfies the grammar.
    """
    # Imported only in the worker process, like llama_cpp in _worker_main: the server never needs them.
    import llama_cpp
    import numpy as np

    class GrammarChecked:
        def __init__(self, chain: Any, grammar: Any, model: Any, n_vocab: int):
            self.chain = chain
            self.grammar = llama_cpp.llama_sampler_init_grammar(
                model.vocab, grammar._grammar.encode("utf-8"), grammar._root.encode("utf-8")
            )
            self.n_vocab = n_vocab
            self.buffer = (llama_cpp.llama_token_data * n_vocab)()
            self.view = np.ctypeslib.as_array(self.buffer)
            self.ids = np.arange(n_vocab, dtype=np.int32)
            self.single = (llama_cpp.llama_token_data * 1)()

        def _all_tokens(self, ctx: Any, idx: int) -> Any:
            logits = llama_cpp.llama_get_logits_ith(ctx.ctx, idx)
            self.view["id"] = self.ids
            self.view["logit"] = np.ctypeslib.as_array(logits, shape=(self.n_vocab,))
            self.view["p"] = 0.0
            data = ctypes.cast(self.buffer, llama_cpp.llama_token_data_p)
            return llama_cpp.llama_token_data_array(data=data, size=self.n_vocab, selected=-1, sorted=False)

        def _allowed(self, token: int) -> bool:
            self.single[0].id, self.single[0].logit, self.single[0].p = token, 0.0, 0.0
            data = ctypes.cast(self.single, llama_cpp.llama_token_data_p)
            one = llama_cpp.llama_token_data_array(data=data, size=1, selected=-1, sorted=False)
            llama_cpp.llama_sampler_apply(self.grammar, ctypes.byref(one))
            return math.isfinite(self.single[0].logit)

        def sample(self, ctx: Any, idx: int) -> int:
            candidates = self._all_tokens(ctx, idx)
            llama_cpp.llama_sampler_apply(self.chain.sampler, ctypes.byref(candidates))
            token = candidates.data[candidates.selected].id
            if not self._allowed(token):
                candidates = self._all_tokens(ctx, idx)
                llama_cpp.llama_sampler_apply(self.grammar, ctypes.byref(candidates))
                llama_cpp.llama_sampler_apply(self.chain.sampler, ctypes.byref(candidates))
                token = candidates.data[candidates.selected].id
            llama_cpp.llama_sampler_accept(self.grammar, token)
            llama_cpp.llama_sampler_accept(self.chain.sampler, token)
            return token

        def close(self) -> None:
            if self.grammar is not None:
                llama_cpp.llama_sampler_free(self.grammar)
                self.grammar = None
            self.chain.close()

    class CheckedGrammarLlama(llama_cpp.Llama):
        def _init_sampler(self, *args: Any, grammar: Any = None, **kwargs: Any) -> Any:
            chain = super()._init_sampler(*args, grammar=None, **kwargs)
            if grammar is None:
                return chain
            return GrammarChecked(chain, grammar, self._model, self._n_vocab)

    return CheckedGrammarLlama
