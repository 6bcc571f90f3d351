"""The model host's error paths (no real model needed)."""

from __future__ import annotations

import multiprocessing
import threading
from pathlib import Path

import pytest

from kernel_lsp.config import Settings
from kernel_lsp.services import llm
from kernel_lsp.services.llm import LlamaModel, LoadOptions, model_from_settings
from kernel_lsp.services.models import ModelError


def test_missing_llama_cpp_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"\x00" * 64)
    monkeypatch.setattr(llm, "llama_available", lambda: False)
    with pytest.raises(ModelError, match="llama-cpp-python is not installed"):
        LlamaModel(gguf).chat([{"role": "user", "content": "hi"}])


def test_a_file_that_is_not_gguf_is_refused_before_any_worker_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(llm, "llama_available", lambda: True)
    bad = tmp_path / "m.gguf"
    bad.write_text("<html>not a model</html>")
    model = LlamaModel(bad)
    with pytest.raises(ModelError, match="is not a GGUF file"):
        model.chat([{"role": "user", "content": "hi"}])
    assert model._process is None


def test_construction_loads_nothing(tmp_path: Path):
    model = LlamaModel(tmp_path / "absent.gguf", LoadOptions(n_ctx=1024, threads=1))
    assert model.load_s is None and model._process is None
    model.close()


@pytest.mark.skipif(not llm.llama_available(), reason="llama-cpp-python is not installed")
def test_a_corrupt_gguf_fails_in_the_worker_not_here(tmp_path: Path):
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"GGUF" + b"\xff" * 256)
    model = LlamaModel(corrupt)
    with pytest.raises(ModelError, match="cannot load"):
        model.chat([{"role": "user", "content": "hi"}], timeout_s=60)
    assert model._process is None


def _model_with_a_silent_worker() -> tuple[LlamaModel, multiprocessing.process.BaseProcess]:
    """A model whose worker never answers, standing in for a generation that runs too long."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    model = LlamaModel("unused.gguf")
    process = ctx.Process(target=_silent_worker, args=(child,), daemon=True)
    process.start()
    model._process, model._conn = process, parent
    return model, process


def test_a_request_that_outlives_its_timeout_kills_the_worker():
    model, process = _model_with_a_silent_worker()
    with pytest.raises(llm.ModelTimeout, match="longer than 1 s"):
        model._receive(1.0, None, what="generating")
    assert not process.is_alive() and model._process is None


def test_cancel_kills_the_worker():
    model, process = _model_with_a_silent_worker()
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    with pytest.raises(llm.ModelCancelled):
        model._receive(60.0, cancel, what="generating")
    assert not process.is_alive()


def _silent_worker(conn) -> None:
    import time

    time.sleep(120)


def test_model_from_settings(tmp_path: Path):
    assert model_from_settings(Settings()) is None
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF" + b"\x00" * 8)
    model = model_from_settings(Settings(model=str(gguf), model_n_gpu_layers=99, model_n_ctx=2048, model_threads=3))
    assert model.path == gguf and model.name == "tiny"
    assert model.options == LoadOptions(n_gpu_layers=99, n_ctx=2048, threads=3)
    with pytest.raises(ModelError, match="unknown model"):
        model_from_settings(Settings(model="no-such-model"))


def test_a_lora_adapter_is_loaded_over_the_model_and_must_be_a_gguf(tmp_path: Path):
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF" + b"\x00" * 8)
    adapter = tmp_path / "adapter.gguf"
    adapter.write_bytes(b"GGUF" + b"\x00" * 8)
    model = model_from_settings(Settings(model=str(gguf), model_lora=str(adapter)))
    assert model.options.lora_path == str(adapter)
    not_gguf = tmp_path / "adapter.safetensors"
    not_gguf.write_bytes(b"{}" + b"\x00" * 10)
    with pytest.raises(ModelError):
        model_from_settings(Settings(model=str(gguf), model_lora=str(not_gguf)))


def test_before_the_first_load_the_tool_format_is_plain(tmp_path: Path):
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF" + b"\x00" * 8)
    model = model_from_settings(Settings(model=str(gguf)))
    assert model.chat_template is None and not model.tool_format.supports_tools
