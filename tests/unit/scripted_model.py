"""ScriptedModel: a test double of :class:`kernel_lsp.services.llm.ChatModel`.

It answers from a list of pre-written replies, in order, so tests of the agent
loop (and of the optimizer above it) run in milliseconds without llama.cpp. A
reply may be a string, a callable that receives the conversation so far (to
answer from what the loop fed back), or an exception instance to raise (to
test timeouts and worker failures).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence

from kernel_lsp.services.llm import ChatModel, ChatRequest, Completion
from kernel_lsp.services.models import ModelError

Reply = str | Callable[[Sequence[Mapping[str, str]]], str] | BaseException


def count_tokens(text: str) -> int:
    """A deterministic stand-in for a tokenizer: whitespace-separated words."""
    return len(text.split())


class ScriptedModel(ChatModel):
    def __init__(self, replies: Sequence[Reply], name: str = "scripted", finish_reason: str = "stop"):
        self.name = name
        self.calls: list[ChatRequest] = []
        """Every request received, in order."""
        self._replies = list(replies)
        self._finish_reason = finish_reason
        self.closed = False

    def _complete(self, request: ChatRequest, timeout_s: float, cancel: threading.Event | None) -> Completion:
        self.calls.append(request)
        if not self._replies:
            raise ModelError("scripted model has no replies left")
        reply = self._replies.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        text = reply(request.messages) if callable(reply) else reply
        prompt_tokens = sum(count_tokens(m.get("content") or "") for m in request.messages)
        return Completion(
            text=text,
            finish_reason=self._finish_reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=count_tokens(text),
            wall_s=0.0,
        )

    @property
    def remaining(self) -> int:
        return len(self._replies)

    def close(self) -> None:
        self.closed = True
