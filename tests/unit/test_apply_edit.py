"""The "Apply" edit of a verified rewrite: only the lines that differ, in the document's own line endings."""

from __future__ import annotations

from kernel_lsp.core.parse import ParsedDocument
from kernel_lsp.server.optimize_actions import minimal_edit

ORIGINAL = "__global__ void k(float *a) {\n  int i = threadIdx.x;\n  a[i] = 2.0f * a[i];\n}\n"
# What a rule returns for the buffer: the buffer's lines as they were, its own new lines ending in "\n".
REWRITTEN = "__global__ void k(float * __restrict__ a) {\n  int i = threadIdx.x;\n  float v = a[i];\n  a[i] = 2.0f * v;\n}\n"


def _applied(text: str, edit) -> str:
    lines = text.split("\n")
    start = sum(len(line) + 1 for line in lines[: edit.range.start.line]) + edit.range.start.character
    end = sum(len(line) + 1 for line in lines[: edit.range.end.line]) + edit.range.end.character
    return text[:start] + edit.new_text + text[end:]


def test_a_crlf_document_gets_crlf_lines_and_only_the_changed_ones():
    crlf = ORIGINAL.replace("\n", "\r\n")
    rewritten = REWRITTEN.replace("  int i = threadIdx.x;\n", "  int i = threadIdx.x;\r\n").replace("}\n", "}\r\n")
    edit = minimal_edit(ParsedDocument(crlf), rewritten)
    assert (edit.range.start.line, edit.range.end.line) == (0, 3)
    assert edit.new_text.count("\r\n") == edit.new_text.count("\n") == 4
    assert _applied(crlf, edit) == REWRITTEN.replace("\n", "\r\n")


def test_an_lf_document_keeps_lf():
    edit = minimal_edit(ParsedDocument(ORIGINAL), REWRITTEN)
    assert "\r" not in edit.new_text
    assert _applied(ORIGINAL, edit) == REWRITTEN
