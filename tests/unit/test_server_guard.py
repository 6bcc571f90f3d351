"""The handler guard: log + empty answer + one message to the user; re-raise under tests."""

from __future__ import annotations

import asyncio

import pytest

from kernel_lsp.server.base import RAISE_ENV, guarded


class _State:
    def __init__(self) -> None:
        self.shown: list[tuple[str, str | None]] = []

    def show(self, message, kind=None, *, once_key=None):
        if once_key is not None and once_key in {key for _, key in self.shown}:
            return
        self.shown.append((message, once_key))


def test_failure_answers_empty_and_tells_the_user_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RAISE_ENV, raising=False)
    state = _State()

    @guarded(state, empty=list, what="hover")  # type: ignore[arg-type]
    def handler(params: object) -> list[int]:
        raise ValueError("bad index")

    assert handler(None) == [] and handler(None) == []
    assert len(state.shown) == 1 and "hover failed (ValueError: bad index)" in state.shown[0][0]


def test_async_handlers_are_guarded_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RAISE_ENV, raising=False)
    state = _State()

    @guarded(state, what="symbols")  # type: ignore[arg-type]
    async def handler(params: object) -> int:
        raise KeyError("x")

    assert asyncio.run(handler(None)) is None
    assert "symbols failed" in state.shown[0][0]


def test_under_tests_the_error_propagates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RAISE_ENV, "1")
    state = _State()

    @guarded(state, empty=list)  # type: ignore[arg-type]
    def handler(params: object) -> list[int]:
        raise ValueError("visible")

    with pytest.raises(ValueError, match="visible"):
        handler(None)
    assert state.shown == []
