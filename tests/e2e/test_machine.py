"""Capabilities known up front: what the machine lacks is said once, and hints and actions adapt."""

from __future__ import annotations

from pathlib import Path

from fake_tools import EXISTS, GPU_H200, NO_DEVICE, fake_tools_env
from lsp_helpers import lsp_session, open_doc, position_of, wait_diagnostics, wait_message
from lsprotocol import types

from kernel_lsp.services.machine import detect_machine

NO_SPEC = "no-spec"


def _actions_params(uri: str, text: str, needle: str) -> types.CodeActionParams:
    at = position_of(text, needle)
    return types.CodeActionParams(text_document=types.TextDocumentIdentifier(uri=uri), range=types.Range(start=at, end=at),
                                  context=types.CodeActionContext(diagnostics=[]))


async def test_without_a_gpu_one_message_and_no_profiling_hints(workspace: Path) -> None:
    text = (workspace / "saxpy.cu").read_text()
    async with lsp_session(workspace, init_options={"nvccPath": "/nonexistent/nvcc"},
                           env=fake_tools_env({"nvidia-smi": NO_DEVICE})) as client:
        uri = open_doc(client, workspace / "saxpy.cu")
        message = await wait_message(client, "no GPU")
        diagnostics = await wait_diagnostics(client, uri)
        actions = await client.text_document_code_action_async(_actions_params(uri, text, "saxpy(int"))
        client.text_document_did_save(types.DidSaveTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri)))
        await client.text_document_document_symbol_async(
            types.DocumentSymbolParams(text_document=types.TextDocumentIdentifier(uri=uri)))
    assert message.type == types.MessageType.Warning
    # One message names everything missing and how to get it; nvcc is mentioned once in the session.
    assert "No devices were found" in message.message and "Optimize" in message.message
    assert sum("nvcc was not found" in m.message for m in client.messages) == 1
    assert sum("no GPU" in m.message for m in client.messages) == 1
    assert not [d for d in diagnostics if d.code == NO_SPEC]
    optimize = next(a for a in actions if a.title.startswith("Optimize saxpy"))
    assert isinstance(optimize, types.CodeAction) and optimize.disabled is not None
    assert optimize.disabled.reason == "needs a GPU to verify"
    # The launch spec can still be drafted (for a machine that has a GPU).
    assert any(a.title.startswith("Create launch spec for saxpy") for a in actions)


async def test_with_a_gpu_hints_and_optimize_are_offered(workspace: Path) -> None:
    text = (workspace / "saxpy.cu").read_text()
    env = fake_tools_env({"nvidia-smi": GPU_H200, "ncu": EXISTS}, pycuda=True)
    async with lsp_session(workspace, init_options={"nvccPath": "/nonexistent/nvcc"}, env=env) as client:
        uri = open_doc(client, workspace / "saxpy.cu")
        diagnostics = await wait_diagnostics(client, uri, lambda ds: any(d.code == NO_SPEC for d in ds))
        actions = await client.text_document_code_action_async(_actions_params(uri, text, "saxpy(int"))
    hinted = sorted(text.splitlines()[d.range.start.line].split("(")[0].split()[-1] for d in diagnostics if d.code == NO_SPEC)
    assert hinted == ["saxpy", "scale"]
    optimize = next(a for a in actions if a.title.startswith("Optimize saxpy"))
    assert isinstance(optimize, types.Command) and optimize.title == "Optimize saxpy"
    assert not [m for m in client.messages if "GPU" in m.message]


def test_detection_reads_nvidia_smi(tmp_path: Path) -> None:
    env = fake_tools_env({"nvidia-smi": GPU_H200})
    smi = env["PATH"].split(":")[0] + "/nvidia-smi"
    found = detect_machine(nvcc_path="/nonexistent/nvcc", ncu_path="/nonexistent/ncu", nvidia_smi=smi)
    assert found.gpu == "NVIDIA H200 (compute 9.0)" and found.gpu_problem is None
    assert found.ncu is None and found.nvcc is None and not found.can_profile
    missing = detect_machine(nvidia_smi=str(tmp_path / "absent"))
    assert missing.gpu is None and missing.gpu_problem == "nvidia-smi was not found"
    assert missing.verify_problem == "needs a GPU to verify"
