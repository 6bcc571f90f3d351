"""Cursor context from the tree: the token under the cursor and the launch slot being typed."""

from __future__ import annotations

import pytest

from kernel_lsp.core.cursor import LaunchContext, launch_context, token_at
from kernel_lsp.core.parse import ParsedDocument


def _at(marked: str):
    offset = marked.index("|")
    src = (marked[:offset] + marked[offset + 1 :]).encode()
    doc = ParsedDocument(src)
    return doc.tree, src, offset


@pytest.mark.parametrize(("marked", "expected"), [
    ("void f() { k<<<|", LaunchContext("k", True, 0)),
    ("void f() { k<<<g, |", LaunchContext("k", True, 1)),
    ("void f() { k<<<dim3(a, b), |", LaunchContext("k", True, 1)),
    ("void f() { scale<4><<<1, 1024, |>>>(y); }", LaunchContext("scale", True, 2)),
    ("void f() { ns::k<<<1, 2>>>(x, |y); }", LaunchContext("k", False, 1)),
    ("void f() { k<<<1, 2>>>(g(a, b), |); }", LaunchContext("k", False, 1)),
    ("void f() { foo(x, |); }", None),
    ("void f() { int a[3] = {1, |}; }", None),
    ("void f() { k<<<1, 2>>>(x); y(|); }", None),
])
def test_launch_context(marked: str, expected: LaunchContext | None) -> None:
    assert launch_context(*_at(marked)) == expected


@pytest.mark.parametrize(("marked", "text"), [
    ("__global__ void k() { int i = threadIdx|.x; }", "threadIdx"),
    ("__global__ void k() { int i = thr|eadIdx.x; }", "threadIdx"),
    ("__global__ void __launch_b|ounds__(256) k() {}", "__launch_bounds__"),
    ("__global__ void k(float* __rest|rict__ p) {}", "__restrict__"),
    ("__global__ void k(float* p) { atomicA|dd(p, 1.0f); }", "atomicAdd"),
])
def test_token_at(marked: str, text: str) -> None:
    token = token_at(*_at(marked))
    assert token is not None and token.text == text
