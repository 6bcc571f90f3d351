"""Apply on a corpus kernel whose launch is in the same file: the edit changes the kernel and its launch.

The candidate is the real warp-per-row rewrite of llm.c's thread-per-row softmax (made here by the
rules, as the optimizer makes it); its verification is injected through the test hook (the GPU
path is covered by the corpus benchmark), so what is tested is the editor's Apply: one edit
against the verified version that rewrites the kernel and launches it with 32 times the blocks.
"""

from __future__ import annotations

import json
from pathlib import Path

from lsp_helpers import lsp_session, open_doc, position_of, wait_diagnostics
from lsprotocol import types

from kernel_lsp.core.rules import RuleGenerator
from kernel_lsp.core.candidates import OptimizeRequest
from kernel_lsp.core.spec import parse_spec

CORPUS = Path(__file__).resolve().parents[2] / "benchmarks" / "corpus" / "llmc_softmax_forward_kernel1"
INJECT = "kernelLsp.test.injectOptimizeResult"
HOST = """
void softmax_forward1(float* out, const float* inp, int N, int C, const int block_size) {
    const int grid_size = ceil_div(N, block_size);
    softmax_forward_kernel1<<<grid_size, block_size>>>(out, inp, N, C);
}
"""


def _apply(text: str, edit: types.TextEdit) -> str:
    lines = text.splitlines(keepends=True)
    start, end = edit.range.start, edit.range.end
    head = "".join(lines[: start.line]) + lines[start.line][: start.character] if start.line < len(lines) else text
    tail = lines[end.line][end.character :] + "".join(lines[end.line + 1 :]) if end.line < len(lines) else ""
    return head + edit.new_text + tail


async def test_apply_edits_kernel_and_launch(tmp_path: Path) -> None:
    folder = tmp_path / "softmax"
    folder.mkdir()
    for header in CORPUS.parent.joinpath("_common").iterdir():
        (tmp_path / header.name).write_text(header.read_text())
    kernel = (CORPUS / "kernel.cu").read_text().replace('"../_common/', '"../')
    text = kernel + HOST
    path = folder / "softmax.cu"
    path.write_text(text)
    spec = parse_spec(json.loads((CORPUS / "spec.json").read_text()))
    request = OptimizeRequest(source=text, path=str(path), kernel=spec.kernel, spec=spec.to_json())
    candidate = next(c for c in RuleGenerator().generate(request) if c.generator == "rule:warp-per-row")
    assert candidate.grid_scale == (32, 1, 1)
    async with lsp_session(tmp_path, env={"KERNEL_LSP_TEST_HOOKS": "1"},
                           init_options={"kbPath": str(tmp_path / "kb.sqlite3"), "nvccPath": "/nonexistent/nvcc"}) as client:
        uri = open_doc(client, path, version=1)
        await wait_diagnostics(client, uri)
        injected = await client.workspace_execute_command_async(types.ExecuteCommandParams(command=INJECT, arguments=[{
            "uri": uri, "kernel": spec.kernel, "version": 1, "original": text, "source": candidate.source,
            "technique": candidate.technique, "speedup": 9.5, "launch_override": dict(candidate.launch_override),
            "grid_scale": list(candidate.grid_scale)}]))
        assert injected is True
        at = position_of(text, "softmax_forward_kernel1(float", 3)
        actions = await client.text_document_code_action_async(types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri), range=types.Range(start=at, end=at),
            context=types.CodeActionContext(diagnostics=[])))
    apply = next(a for a in actions if isinstance(a, types.CodeAction) and a.title.startswith("Apply"))
    launch_line = text[: text.index("softmax_forward_kernel1<<<")].count("\n") + 1
    assert apply.title == f"Apply warp-per-row: 9.50x faster (verified, max rel err 3e-07) (launch at line {launch_line} edited too)"
    new = _apply(text, apply.edit.document_changes[0].edits[0])
    assert "kl_warp_max(maxval)" in new and "j += 32" in new
    assert "softmax_forward_kernel1<<<dim3(dim3(grid_size).x * 32, dim3(grid_size).y, dim3(grid_size).z), block_size>>>" in new
    assert new.count("<<<") == 1
