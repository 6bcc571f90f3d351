"""What kernel-lsp adds beside clangd: launch -> kernel definition, built-in docs on hover,
signature help inside <<< >>> (also while the launch is half typed)."""

from __future__ import annotations

from pathlib import Path

from lsp_helpers import SAXPY, hover_text, lsp_session, open_doc, position_of
from lsprotocol import types

from kernel_lsp.services.intrinsics import intrinsics

WARP = """\
__global__ void __launch_bounds__(256) reduce(const float* __restrict__ in, float* out, int n) {
    extern __shared__ float partial[];
    float v = __ldg(&in[blockIdx.x * blockDim.x + threadIdx.x]);
    for (int d = 16; d > 0; d >>= 1) v += __shfl_down_sync(0xffffffff, v, d);
    if (threadIdx.x % warpSize == 0) atomicAdd(out, __expf(v));
    __syncthreads();
}

void run(const float* in, float* out, int n) {
    reduce<<<(n + 255) / 256, 256, 64>>>(in, out, n);
}
"""
OPTIONS = {"nvccPath": "/nonexistent/nvcc"}


def _doc(uri: str) -> types.TextDocumentIdentifier:
    return types.TextDocumentIdentifier(uri=uri)


async def test_definition_of_a_launch_is_its_kernel(workspace: Path) -> None:
    async with lsp_session(workspace, init_options=OPTIONS) as client:
        uri = open_doc(client, workspace / "saxpy.cu")
        on_launch = await client.text_document_definition_async(types.DefinitionParams(
            text_document=_doc(uri), position=position_of(SAXPY, "saxpy<<<", 2)))
        on_template = await client.text_document_definition_async(types.DefinitionParams(
            text_document=_doc(uri), position=position_of(SAXPY, "scale<4>", 1)))
        elsewhere = await client.text_document_definition_async(types.DefinitionParams(
            text_document=_doc(uri), position=position_of(SAXPY, "twice(cache")))
    (location,) = on_launch
    assert location.uri == uri and location.range.start == position_of(SAXPY, "saxpy(int")
    assert [loc.range.start for loc in on_template] == [position_of(SAXPY, "scale(float")]
    assert list(elsewhere or []) == []  # clangd's to answer


async def test_builtins_are_documented_on_hover(tmp_path: Path) -> None:
    path = tmp_path / "warp.cu"
    path.write_text(WARP)
    names = ["__shfl_down_sync", "atomicAdd", "__ldg", "__syncthreads", "__restrict__", "__launch_bounds__",
             "threadIdx", "blockIdx", "blockDim", "warpSize", "__expf"]
    async with lsp_session(tmp_path, init_options=OPTIONS) as client:
        uri = open_doc(client, path)
        hovers = {name: await client.text_document_hover_async(types.HoverParams(
            text_document=_doc(uri), position=position_of(WARP, name, 2))) for name in names}
        kernel = await client.text_document_hover_async(types.HoverParams(
            text_document=_doc(uri), position=position_of(WARP, "reduce(", 1)))
    for name, hover in hovers.items():
        text = hover_text(hover)
        assert intrinsics()[name].signature in text and intrinsics()[name].summary in text, name
        start = position_of(WARP, name)
        assert hover.range == types.Range(start=start, end=types.Position(line=start.line, character=start.character + len(name)))
    assert "lane 0 ends with the total" in hover_text(hovers["__shfl_down_sync"])
    # A kernel's own hover is unchanged: its signature, not a built-in's.
    assert "__global__ __launch_bounds__(256) void reduce(" in hover_text(kernel)


async def test_signature_help_in_the_launch_configuration_and_arguments(tmp_path: Path) -> None:
    path = tmp_path / "warp.cu"
    path.write_text(WARP)
    async with lsp_session(tmp_path, init_options=OPTIONS) as client:
        uri = open_doc(client, path)
        in_block = await client.text_document_signature_help_async(types.SignatureHelpParams(
            text_document=_doc(uri), position=position_of(WARP, "256, 64>>>", 1)))
        in_smem = await client.text_document_signature_help_async(types.SignatureHelpParams(
            text_document=_doc(uri), position=position_of(WARP, "64>>>")))
        in_args = await client.text_document_signature_help_async(types.SignatureHelpParams(
            text_document=_doc(uri), position=position_of(WARP, "out, n);")))
        outside = await client.text_document_signature_help_async(types.SignatureHelpParams(
            text_document=_doc(uri), position=position_of(WARP, "v = __ldg")))
        # Half typed: "reduce<<<grid, " on a new line of run().
        line = position_of(WARP, "}\n", 0, 1).line  # the closing brace of run()
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[types.TextDocumentContentChangePartial(
                range=types.Range(start=types.Position(line=line, character=0), end=types.Position(line=line, character=0)),
                text="    reduce<<<8, ")]))
        typing = await client.text_document_signature_help_async(types.SignatureHelpParams(
            text_document=_doc(uri), position=types.Position(line=line, character=len("    reduce<<<8, "))))
    (config,) = in_block.signatures
    assert config.label == "reduce<<<dim3 gridDim, dim3 blockDim, size_t sharedMemBytes = 0, cudaStream_t stream = 0>>>"
    assert in_block.active_parameter == 1 and in_smem.active_parameter == 2
    documentation = config.documentation.value
    assert "__launch_bounds__(256)" in documentation and "partial" in documentation
    (args,) = in_args.signatures
    assert args.label == "reduce(const float* __restrict__ in, float* out, int n)" and in_args.active_parameter == 1
    assert outside is None
    assert typing is not None and typing.active_parameter == 1 and typing.signatures[0].label.startswith("reduce<<<")
