"""Tool-call formats read from chat templates (fragments of the real templates of three model families)."""

from __future__ import annotations

from kernel_lsp.core.chat_template import PLAIN, arguments_as_objects, tool_exchange, tool_format

# The parts of Qwen2.5-Coder's template (its GGUF's tokenizer.chat_template) that render calls and results.
QWEN = """{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- for tool_call in message.tool_calls %}
            {{- '\\n<tool_call>\\n{"name": "' }}{{- tool_call.name }}{{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}
        {%- endfor %}
    {%- elif message.role == "tool" %}
        {{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}
    {%- endif %}
{%- endfor %}"""

MISTRAL = """{%- for message in messages %}{%- if message["role"] == "user" %}[INST] {{ message["content"] }}[/INST]
{%- elif message.tool_calls is defined and message.tool_calls is not none %}[TOOL_CALLS] [{{ message.tool_calls|tojson }}]
{%- elif message["role"] == "tool" %}[TOOL_RESULTS] {{ message.content }}[/TOOL_RESULTS]{%- endif %}{%- endfor %}"""

# A template with no tool support (an older chat model): calls would be dropped, so plain messages are used.
PLAIN_TEMPLATE = """{% for message in messages %}<|im_start|>{{ message['role'] }}
{{ message['content'] }}<|im_end|>
{% endfor %}"""


def test_qwen_template_renders_tool_calls_between_its_tags():
    fmt = tool_format(QWEN)
    assert fmt.supports_tools and (fmt.call_open, fmt.call_close) == ("<tool_call>", "</tool_call>")
    assert fmt.source == "gguf"


def test_mistral_template_marks_calls_with_a_bracketed_token():
    fmt = tool_format(MISTRAL)
    assert fmt.supports_tools and fmt.call_open == "[TOOL_CALLS]" and fmt.call_close is None


def test_a_template_without_tool_messages_and_no_template_give_plain_messages():
    assert not tool_format(PLAIN_TEMPLATE).supports_tools
    assert tool_format(None) == tool_format("") and not tool_format(None).supports_tools
    assert tool_format(None).source == "none"


def test_an_exchange_is_a_native_call_and_result_or_two_plain_messages():
    native = tool_exchange(tool_format(QWEN), "call_1", "edit", '{"hunks": []}', "hunk 1: not found", "Result:")
    assert native[0]["tool_calls"][0] == {"id": "call_1", "type": "function",
                                          "function": {"name": "edit", "arguments": '{"hunks": []}'}}
    assert native[1] == {"role": "tool", "tool_call_id": "call_1", "name": "edit", "content": "hunk 1: not found"}
    plain = tool_exchange(PLAIN, "call_1", "edit", '{"hunks": []}', "hunk 1: not found", "Result:")
    assert plain == [{"role": "assistant", "content": '{"hunks": []}'},
                     {"role": "user", "content": "Result:\nhunk 1: not found"}]


def test_arguments_become_objects_for_jinja_templates_and_bad_json_stays_text():
    messages = tool_exchange(tool_format(QWEN), "c", "edit", '{"hunks": [{"search": "a", "replace": "b"}]}', "ok", "")
    messages.append({"role": "assistant", "content": None,
                     "tool_calls": [{"id": "d", "type": "function", "function": {"name": "edit", "arguments": "{oops"}}]})
    fixed = arguments_as_objects(messages)
    assert fixed[0]["tool_calls"][0]["function"]["arguments"] == {"hunks": [{"search": "a", "replace": "b"}]}
    assert fixed[2]["tool_calls"][0]["function"]["arguments"] == "{oops"
    assert messages[0]["tool_calls"][0]["function"]["arguments"].startswith("{")  # the input is not changed
