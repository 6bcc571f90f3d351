"""What a model's chat template says about tool calls, read from the template itself.

A GGUF carries its chat template (``tokenizer.chat_template``, Jinja); llama.cpp
renders conversations with it, so kernel-lsp never hard-codes a model family's
format. What the model jobs need to know is whether the template renders tool
calls and tool results (an assistant message's ``tool_calls``, a ``tool`` role):
then the harness's answers to the model's edits go back as tool results, the way
the model was trained to read them; otherwise as plain user messages. The
markers the template wraps a call in (``<tool_call>``, ``[TOOL_CALLS]``,
``<|python_tag|>``) are read from it for the record and the traces.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Literal text the template emits around a call: an XML-like tag, a bracketed word or a special token
# whose name says tool/function call.
_MARKER = re.compile(
    r"(<\|?[A-Za-z_]*(?:tool_call|function_call|python_tag|tool_calls)[A-Za-z_]*\|?>|\[TOOL_CALLS\])")


@dataclass(frozen=True)
class ToolFormat:
    supports_tools: bool
    """The template renders assistant ``tool_calls`` and ``tool`` messages."""
    call_open: str | None = None
    """What the template writes before a call (``<tool_call>``), when it writes a marker."""
    call_close: str | None = None
    source: str = "none"
    """Where the template came from: ``gguf`` (the file's metadata), ``server`` (an endpoint's /props) or
    ``none`` (unknown: plain messages are used)."""


PLAIN = ToolFormat(supports_tools=False)


def tool_format(template: str | None, source: str = "gguf") -> ToolFormat:
    """The tool-call format of a Jinja chat template (``None``: unknown, plain messages)."""
    if not template:
        return ToolFormat(False, source="none")
    renders_calls = "tool_calls" in template
    renders_results = bool(re.search(r"""role['"]?\]?\s*==\s*['"]tool['"]|['"]tool['"]\s*==\s*\w+(?:\.role|\[['"]role['"]\])""", template))
    markers = [m for m in _MARKER.findall(template) if not m.startswith("</")]
    call_open = markers[0] if markers else None
    call_close = None
    if call_open and call_open.startswith("<") and not call_open.startswith("<|"):
        closing = "</" + call_open[1:]
        call_close = closing if closing in template else None
    return ToolFormat(renders_calls and renders_results, call_open, call_close, source)


def tool_exchange(fmt: ToolFormat, call_id: str, name: str, arguments: str, result: str,
                  result_label: str) -> list[dict[str, Any]]:
    """One model answer (the JSON ``arguments`` of the tool ``name``) and the harness's ``result``, as chat
    messages: a native tool call and tool result when the template renders them, else the answer as the
    assistant's text and the result as a user message headed by ``result_label``."""
    if not fmt.supports_tools:
        return [{"role": "assistant", "content": arguments}, {"role": "user", "content": f"{result_label}\n{result}"}]
    return [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": call_id, "name": name, "content": result},
    ]


def arguments_as_objects(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages whose tool calls carry their arguments as objects, not JSON text.

    The OpenAI wire format sends arguments as a string; Jinja chat templates (Hugging Face's convention,
    which GGUF templates follow) write ``arguments | tojson`` and expect an object, or they would show
    the model a quoted string."""
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if not calls:
            out.append(dict(message))
            continue
        fixed = []
        for call in calls:
            function = dict(call.get("function") or {})
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                try:
                    function["arguments"] = json.loads(arguments, strict=False)
                except (ValueError, RecursionError):
                    pass
            fixed.append({**call, "function": function})
        out.append({**message, "tool_calls": fixed})
    return out
