"""Launch configuration evaluation: snippets whose launch `k<<<...>>>` has a known (or unknown) size."""

from __future__ import annotations

import pytest

from kernel_lsp.core.index import build_index
from kernel_lsp.core.launch_dims import block_dims, block_threads, defines_from_flags, evaluate_launch

PRELUDE = """\
#define BLOCK 256
#define WARPS (BLOCK / 32)
constexpr int TILE = 16;
const unsigned ROWS = 8;
__global__ void k(float* p) {}
"""


def _launch_threads(body: str) -> int | None:
    source = PRELUDE + "void host(float* p, int n) {\n" + body + "\n}\n"
    index = build_index(source)
    (launch,) = index.launches
    return block_threads(launch, source, index)


@pytest.mark.parametrize(
    ("body", "threads"),
    [
        ("k<<<1, 256>>>(p);", 256),
        ("k<<<1, BLOCK>>>(p);", 256),
        ("k<<<1, WARPS * 32>>>(p);", 256),
        ("k<<<1, dim3(16, 16)>>>(p);", 256),
        ("k<<<1, dim3(TILE, TILE, 2)>>>(p);", 512),
        ("k<<<1, {32, ROWS}>>>(p);", 256),
        ("dim3 block(32, 8);\nk<<<1, block>>>(p);", 256),
        ("dim3 block = dim3(TILE, 4);\nk<<<1, block>>>(p);", 64),
        ("dim3 block{64};\nk<<<1, block>>>(p);", 64),
        ("int threads = 128;\nk<<<(n + threads - 1) / threads, threads>>>(p);", 128),
        ("const int T = 2 * 32; // a comment with k<<<\ndim3 b(T, 2);\nk<<<1, b>>>(p);", 128),
        ("#define LOCAL 96\nk<<<1, LOCAL>>>(p);", 96),
        ("k<<<1, n>>>(p);", None),
        ("int threads = 128;\nthreads = n;\nk<<<1, threads>>>(p);", None),
        ("dim3 block(32, 8);\nblock.x = n;\nk<<<1, block>>>(p);", None),
        ("int threads = 128;\nthreads *= 2;\nk<<<1, threads>>>(p);", None),
        ("dim3 block(n, 8);\nk<<<1, block>>>(p);", None),
        ("k<<<1, 0>>>(p);", None),
        ("k<<<1, unknown_fn()>>>(p);", None),
    ],
)
def test_block_threads(body: str, threads: int | None) -> None:
    assert _launch_threads(body) == threads


def test_full_evaluation() -> None:
    source = PRELUDE + "void host(float* p, cudaStream_t s) {\n dim3 grid(64, 2);\n k<<<grid, dim3(32, 4), 4 * sizeof(float) * BLOCK, s>>>(p);\n}\n"
    index = build_index(source)
    dims = evaluate_launch(index.launches[0], source, index)
    assert (dims.grid, dims.block, dims.block_threads, dims.grid_blocks, dims.dynamic_shared_bytes) == (
        (64, 2, 1), (32, 4, 1), 128, 128, 4096,
    )
    assert block_dims(index.launches[0], source, index) == (32, 4, 1)


def test_no_shared_argument_is_zero_and_unknown_is_none() -> None:
    source = PRELUDE + "void host(float* p, int n) { k<<<n, 32>>>(p); k<<<1, 32, n * 4>>>(p); }\n"
    index = build_index(source)
    first, second = (evaluate_launch(launch, source, index) for launch in index.launches)
    assert (first.grid, first.dynamic_shared_bytes) == (None, 0)
    assert second.dynamic_shared_bytes is None


def test_extra_constants_from_flags() -> None:
    source = "__global__ void k() {}\nvoid h() { k<<<1, THREADS>>>(); }\n"
    index = build_index(source)
    assert block_threads(index.launches[0], source, index) is None
    assert block_threads(index.launches[0], source, index, {"THREADS": "64"}) == 64


def test_defines_from_flags_reads_every_spelling_and_undefines() -> None:
    argv = ["nvcc", "-DA=3", "-D", "B=4", "-DC", "-D", "BAD-NAME", "--define-macro=E=5", "--define-macro", "F=6",
            "-UC", "-U", "B", "-I/x", "-DTILE=(2*8)", "-D"]
    assert defines_from_flags(argv) == {"A": "3", "E": "5", "F": "6", "TILE": "(2*8)"}
    assert defines_from_flags(["-DONLY"]) == {"ONLY": "1"}


def test_command_line_define_wins_over_a_guarded_default_only() -> None:
    guarded = ("#ifndef BLOCK\n#define BLOCK 128\n#endif\n__global__ void k() {}\n"
               "void h() { k<<<1, BLOCK>>>(); }\n")
    plain = "#define BLOCK 128\n__global__ void k() {}\nvoid h() { k<<<1, BLOCK>>>(); }\n"
    for source, expected in ((guarded, 512), (plain, 128)):
        index = build_index(source)
        assert block_threads(index.launches[0], source, index) == 128
        assert block_threads(index.launches[0], source, index, defines_from_flags(["-DBLOCK=512"])) == expected
    defined = guarded.replace("#ifndef BLOCK", "#if !defined(BLOCK)")
    index = build_index(defined)
    assert block_threads(index.launches[0], defined, index, {"BLOCK": "64"}) == 64
