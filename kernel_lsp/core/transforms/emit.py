"""A small code emitter: edits on a kernel's preprocessed body, spliced back into the user's file.

Transformations decide from the access analysis, whose byte ranges refer to the preprocessed
text; they edit that text (:class:`BodyEdit`) and the result replaces the kernel's body in the
file the user wrote (:func:`splice_body`). The kernel's signature, the rest of the file and
every macro definition stay as written; a macro used inside the body appears expanded in the
candidate (its description says so).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tree_sitter import Node, Parser

from kernel_lsp.core.analysis import KernelFacts
from kernel_lsp.core.index import Function
from kernel_lsp.core.parse import CUDA_LANGUAGE
from kernel_lsp.core.source import Preprocessed


class EmitError(ValueError):
    """Edits that overlap or fall outside the kernel's body: a transformation bug, refused."""


@dataclass
class BodyEdit:
    pre: Preprocessed
    facts: KernelFacts
    edits: list[tuple[int, int, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.src = self.pre.text.encode("utf-8")

    def text(self, start: int, end: int) -> str:
        return self.src[start:end].decode("utf-8")

    def indent_at(self, at: int) -> str:
        """The whitespace before the first non-blank character of ``at``'s line."""
        line_start = self.src.rfind(b"\n", 0, at) + 1
        line = self.src[line_start:at].decode("utf-8")
        return line[: len(line) - len(line.lstrip())]

    def replace(self, start: int, end: int, new: str) -> None:
        lo, hi = self.facts.body_span
        if not lo <= start <= end <= hi:
            raise EmitError(f"edit {start}-{end} outside the kernel body {lo}-{hi}")
        self.edits.append((start, end, new))

    def insert(self, at: int, new: str) -> None:
        self.replace(at, at, new)

    def body(self) -> str:
        lo, hi = self.facts.body_span
        out: list[bytes] = []
        at = lo
        for start, end, new in sorted(self.edits, key=lambda e: (e[0], e[1])):
            if start < at:
                raise EmitError(f"overlapping edits at byte {start}")
            out.append(self.src[at:start])
            out.append(new.encode("utf-8"))
            at = end
        out.append(self.src[at:hi])
        return b"".join(out).decode("utf-8")

    @property
    def changed(self) -> bool:
        return bool(self.edits)


def unit_start(source: str, function: Function) -> int:
    """Byte offset of the line where the kernel's definition starts, template header and a
    ``extern "C"`` wrapping it included: where helpers it needs are inserted."""
    src = source.encode("utf-8")
    root = Parser(CUDA_LANGUAGE).parse(src).root_node
    node: Node | None = root.descendant_for_byte_range(function.span.start_byte, function.span.start_byte)
    while node is not None and node.type != "function_definition":
        node = node.parent
    start = function.span.start_byte
    while node is not None:
        if node.type in ("function_definition", "template_declaration") or (
                node.type == "linkage_specification" and node.named_child_count <= 2):
            start = min(start, node.start_byte)
        elif node.type != "declaration_list":
            break
        node = node.parent
    return src.rfind(b"\n", 0, start) + 1


def splice_body(source: str, function: Function, new_body: str, helpers: str = "") -> str:
    """The user's file with ``function``'s body replaced by ``new_body`` and ``helpers`` (device
    functions the new body calls) inserted before the kernel's definition."""
    if function.body_span is None:
        raise EmitError("the kernel has no body in this file")
    src = source.encode("utf-8")
    start, end = function.body_span.start_byte, function.body_span.end_byte
    out = src[:start] + new_body.encode("utf-8") + src[end:]
    if helpers:
        at = unit_start(source, function)
        out = out[:at] + helpers.encode("utf-8") + out[at:]
    return out.decode("utf-8")


def node_at(pre_src: bytes, root: Node, span: tuple[int, int]) -> Node | None:
    node = root.descendant_for_byte_range(span[0], span[1])
    while node is not None and (node.start_byte, node.end_byte) != span:
        node = node.parent
    return node


def parse(pre: Preprocessed) -> tuple[bytes, Node]:
    src = pre.text.encode("utf-8")
    return src, Parser(CUDA_LANGUAGE).parse(src).root_node


WARP_REDUCE = {
    "+": "kl_warp_sum",
    "max": "kl_warp_max",
    "min": "kl_warp_min",
}


def warp_reduce_helpers(ops: set[str], source: str) -> str:
    """Butterfly reductions over a full warp (every lane gets the result), for the operators a
    transformation needs and the file does not define yet."""
    bodies = {
        "+": "v += __shfl_xor_sync(0xffffffffu, v, o);",
        "max": "v = max(v, __shfl_xor_sync(0xffffffffu, v, o));",
        "min": "v = min(v, __shfl_xor_sync(0xffffffffu, v, o));",
    }
    out = []
    for op in sorted(ops):
        name = WARP_REDUCE[op]
        if name in source:
            continue
        out.append(f"template <typename T>\n__device__ __forceinline__ T {name}(T v) {{\n"
                   f"    for (int o = 16; o > 0; o >>= 1) {bodies[op]}\n    return v;\n}}\n")
    return "".join(out)
