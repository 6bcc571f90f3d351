"""Knowledge-base notices reach the user in the editor when a search opens the knowledge base."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fake_tools import GPU_H200, fake_tools_env
from lsp_helpers import lsp_session, needs_nvcc, open_doc, wait_diagnostics, wait_message
from lsprotocol import types

from kernel_lsp.core.kb_logic import Attempt
from kernel_lsp.services.kb import KnowledgeBase

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def transpose(tmp_path: Path) -> Path:
    path = tmp_path / "t.cu"
    shutil.copy(EXAMPLES / "transpose" / "original.cu", path)
    shutil.copy(EXAMPLES / "transpose" / "spec.json", tmp_path / "t.cu.transpose.spec.json")
    return path


async def _optimize_and_wait(transpose: Path, kb_path: Path, needle: str) -> types.ShowMessageParams:
    options = {"kbPath": str(kb_path), "optimizeBudgetCandidates": 1, "nvccPath": "/nonexistent/nvcc"}
    # The search (which opens the knowledge base) runs only where a GPU is seen: a stand-in one.
    env = fake_tools_env({"nvidia-smi": GPU_H200}, pycuda=True)
    async with lsp_session(transpose.parent, init_options=options, env=env) as client:
        uri = open_doc(client, transpose)
        await wait_diagnostics(client, uri)
        await client.workspace_execute_command_async(types.ExecuteCommandParams(
            command="kernelLsp.optimize", arguments=[uri, "transpose"]))
        return await wait_message(client, needle)


@needs_nvcc
async def test_emptied_knowledge_base_is_reported_with_its_backup(transpose: Path) -> None:
    kb_path = transpose.parent / "kb.sqlite3"
    with KnowledgeBase.open(kb_path) as kb:
        for n in range(3):
            kb.record_attempt(Attempt(
                kernel_hash=f"k{n}", file="a.cu", kernel="transpose", state="latency-bound",
                technique="grid-stride-loop", candidate_hash=f"c{n}", verdict="accepted", accepted=True,
                speedup=1.2, created_at=f"2026-01-01T00:00:0{n}+00:00"))
    for side in ("-wal", "-shm"):
        (transpose.parent / f"kb.sqlite3{side}").unlink(missing_ok=True)
    kb_path.write_bytes(b"")
    message = await _optimize_and_wait(transpose, kb_path, "kb restore")
    assert "3 attempts" in message.message and message.type == types.MessageType.Warning


@needs_nvcc
async def test_foreign_kb_path_is_refused_visibly_and_left_alone(transpose: Path) -> None:
    bashrc = transpose.parent / ".bashrc"
    bashrc.write_text("alias ll='ls -l'\n")
    message = await _optimize_and_wait(transpose, bashrc, "knowledge base unavailable")
    assert "not a SQLite database" in message.message
    assert bashrc.read_text() == "alias ll='ls -l'\n"
    assert not list(transpose.parent.glob(".bashrc.*"))
