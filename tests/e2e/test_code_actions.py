"""The optimizer's code actions through the real server: "Optimize <kernel>" is disabled with its
reason on a machine without a GPU; a verified result's "Apply" edits exactly the verified
document version and is not offered once the document changed."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
from fake_tools import NO_DEVICE, fake_tools_env
from lsp_helpers import lsp_session, open_doc, position_of, wait_diagnostics, wait_message
from lsprotocol import types

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
HAS_GPU_STACK = importlib.util.find_spec("pycuda") is not None
INJECT = "kernelLsp.test.injectOptimizeResult"
#: A PATH whose nvidia-smi finds no GPU (see test_machine.py), whatever the machine running the tests has.
NO_GPU_ENV = fake_tools_env({"nvidia-smi": NO_DEVICE})


@pytest.fixture
def transpose(tmp_path: Path) -> Path:
    path = tmp_path / "t.cu"
    shutil.copy(EXAMPLES / "transpose" / "original.cu", path)
    shutil.copy(EXAMPLES / "transpose" / "spec.json", tmp_path / "t.cu.transpose.spec.json")
    return path


def _params(uri: str, text: str, needle: str) -> types.CodeActionParams:
    at = position_of(text, needle)
    return types.CodeActionParams(text_document=types.TextDocumentIdentifier(uri=uri), range=types.Range(start=at, end=at),
                                  context=types.CodeActionContext(diagnostics=[]))


def _titles(actions) -> list[str]:
    return [a.title for a in actions or []]


def _apply(text: str, edit: types.TextEdit) -> str:
    lines = text.split("\n")

    def offset(p: types.Position) -> int:
        return sum(len(line) + 1 for line in lines[: p.line]) + p.character

    return text[: offset(edit.range.start)] + edit.new_text + text[offset(edit.range.end):]


async def test_optimize_offered_on_kernels_only(transpose: Path) -> None:
    text = transpose.read_text()
    async with lsp_session(transpose.parent, init_options={"kbPath": str(transpose.parent / "kb.sqlite3")}) as client:
        uri = open_doc(client, transpose)
        await wait_diagnostics(client, uri)  # the document is open and analysed
        on_kernel = await client.text_document_code_action_async(_params(uri, text, "transpose(float"))
        in_comment = await client.text_document_code_action_async(_params(uri, text, "Naive out-of-place"))
    assert any(t.startswith("Optimize transpose") for t in _titles(on_kernel))
    assert not any(t.startswith(("Optimize", "Apply")) for t in _titles(in_comment))


@pytest.mark.skipif(HAS_GPU_STACK, reason="checks the no-GPU path")
async def test_without_a_gpu_optimize_is_disabled_with_its_reason(transpose: Path) -> None:
    text = transpose.read_text()
    options = {"kbPath": str(transpose.parent / "kb.sqlite3"), "optimizeBudgetCandidates": 2}
    async with lsp_session(transpose.parent, init_options=options, env=NO_GPU_ENV) as client:
        uri = open_doc(client, transpose)
        await wait_message(client, "no GPU")  # the machine is known
        actions = await client.text_document_code_action_async(_params(uri, text, "transpose(float"))
        optimize = next(a for a in actions if a.title.startswith("Optimize transpose"))
        # A client that runs the command anyway (a key binding) hears why at once, before any spec talk.
        await client.workspace_execute_command_async(types.ExecuteCommandParams(
            command="kernelLsp.optimize", arguments=[uri, "transpose"]))
        message = await wait_message(client, "Optimize transpose:")
    assert isinstance(optimize, types.CodeAction) and optimize.title == "Optimize transpose (needs a GPU to verify)"
    assert optimize.disabled is not None and optimize.disabled.reason == "needs a GPU to verify"
    assert optimize.command is None and optimize.edit is None
    assert "needs a GPU to verify" in message.message and "launch spec" not in message.message


async def test_verified_result_edits_the_verified_version_only(transpose: Path) -> None:
    text = transpose.read_text()
    candidate = (EXAMPLES / "transpose" / "honest_tiled.cu").read_text()
    async with lsp_session(transpose.parent, env={"KERNEL_LSP_TEST_HOOKS": "1"},
                           init_options={"kbPath": str(transpose.parent / "kb.sqlite3")}) as client:
        uri = open_doc(client, transpose, version=1)
        await wait_diagnostics(client, uri)
        injected = await client.workspace_execute_command_async(types.ExecuteCommandParams(command=INJECT, arguments=[{
            "uri": uri, "kernel": "transpose", "version": 1, "original": text, "source": candidate,
            "technique": "transpose-via-shared-memory", "speedup": 2.31, "max_rel_error": 3e-7}]))
        assert injected is True
        actions = await client.text_document_code_action_async(_params(uri, text, "transpose(float"))
        apply = next(a for a in actions if isinstance(a, types.CodeAction) and a.title.startswith("Apply"))
        assert apply.title == "Apply transpose-via-shared-memory: 2.31x faster (verified, max rel err 3e-07)"
        change = apply.edit.document_changes[0]
        assert change.text_document.version == 1
        assert _apply(text, change.edits[0]) == candidate

        # Any edit makes the verified result stale: the action stays visible but disabled, without an edit.
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=text + "// edited\n")]))
        stale = await client.text_document_code_action_async(_params(uri, text, "transpose(float"))
    applies = [a for a in stale if isinstance(a, types.CodeAction) and a.title.startswith("Apply")]
    assert len(applies) == 1 and applies[0].edit is None
    assert applies[0].title.endswith(": stale") and "changed since version 1" in applies[0].disabled.reason
