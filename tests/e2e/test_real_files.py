"""Every real kernel file the project keeps (the corpus, the outside set, the examples) through the real
server as an editor opens it: symbols, hover on each kernel, code lenses, inlay hints and code actions all
answer, none with an error, and the server stays up for the next file."""

from __future__ import annotations

from pathlib import Path

from lsp_helpers import lsp_session, open_doc, position_of, wait_diagnostics
from lsprotocol import types

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted([*ROOT.glob("benchmarks/corpus/*/kernel.cu"), *ROOT.glob("benchmarks/outside/*/kernel.cu"),
                *ROOT.glob("examples/*/original.cu")])


async def test_every_real_kernel_file_gets_every_answer_without_an_error(tmp_path: Path) -> None:
    assert len(FILES) > 100
    async with lsp_session(ROOT, init_options={"nvccPath": "/nonexistent/nvcc", "kbPath": str(tmp_path / "kb.sqlite3")}) as client:
        for path in FILES:
            text = path.read_text(encoding="utf-8")
            uri = open_doc(client, path, text)
            doc = types.TextDocumentIdentifier(uri=uri)
            symbols = await client.text_document_document_symbol_async(types.DocumentSymbolParams(text_document=doc))
            kernels = [s for s in symbols or [] if isinstance(s, types.DocumentSymbol) and "__global__" in (s.detail or "")]
            assert symbols, path
            for symbol in kernels or symbols[:1]:
                at = symbol.selection_range.start if isinstance(symbol, types.DocumentSymbol) else position_of(text, "__global__")
                await client.text_document_hover_async(types.HoverParams(text_document=doc, position=at))
                await client.text_document_code_action_async(types.CodeActionParams(
                    text_document=doc, range=types.Range(start=at, end=at), context=types.CodeActionContext(diagnostics=[])))
            await client.text_document_code_lens_async(types.CodeLensParams(text_document=doc))
            end = types.Position(line=text.count("\n") + 1, character=0)
            await client.text_document_inlay_hint_async(types.InlayHintParams(
                text_document=doc, range=types.Range(start=types.Position(line=0, character=0), end=end)))
            await wait_diagnostics(client, uri)
            client.text_document_did_close(types.DidCloseTextDocumentParams(text_document=doc))
    assert not [m for m in client.messages if m.type == types.MessageType.Error]
