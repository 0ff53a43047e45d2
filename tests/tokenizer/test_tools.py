"""Tools in the chat prompt: a template's own tool format, or hermes' for one without."""

from __future__ import annotations

import json

from libs.protocol.messages import ChatMessage, EncodeRequest, ToolCall, ToolSpec

PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [ToolSpec(name="get_weather", description="Weather of a city", parameters=json.dumps(PARAMS))]
MESSAGES = [
    ChatMessage(role="user", content="Weather in Paris?"),
    ChatMessage(role="assistant", content="", tool_calls=[ToolCall(id="c1", name="get_weather",
                                                                   arguments='{"city": "Paris"}')]),
    ChatMessage(role="tool", content='{"temp": 20}', tool_call_id="c1"),
]
# a template that reads tools (Qwen-like, reduced): what tools / tool_calls / tool_call_id reach
TOOL_TEMPLATE = (
    "{% if tools %}TOOLS:{% for t in tools %}{{ t.function.name }}={{ t.function.parameters | tojson }};"
    "{% endfor %}\n{% endif %}{% for m in messages %}<{{ m.role }}>{{ m.content }}"
    "{% for c in m.tool_calls or [] %}[call {{ c.id }} {{ c.function.name }} {{ c.function.arguments.city }}]"
    "{% endfor %}{% if m.tool_call_id %}(for {{ m.tool_call_id }}){% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def _text(encoder, tools=TOOLS, messages=MESSAGES) -> str:
    ids = encoder.encode(EncodeRequest(rid="r", gateway="gw-1", messages=messages, tools=tools)).input_ids
    return encoder.tokenizer.decode(ids)


def test_a_template_without_tools_gets_hermes_tools_calls_and_responses(encoder):
    text = _text(encoder)
    assert text.startswith("<|im_start|>system\n# Tools")
    assert json.dumps(PARAMS) in text and "<tools>" in text
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert '<|im_start|>user\n<tool_response>\n{"temp": 20}\n</tool_response><|im_end|>' in text
    assert text.endswith("<|im_start|>assistant\n")


def test_no_tools_renders_as_before(encoder, tokenizer):
    plain = [ChatMessage(role="user", content="hi")]
    want = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                         tokenize=False)
    assert _text(encoder, [], plain) == want


def test_a_template_with_tools_gets_them_as_transformers_passes_them(encoder):
    enc = encoder.copy()
    enc.tokenizer.chat_template = TOOL_TEMPLATE
    want = enc.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Weather in Paris?"},
         {"role": "assistant", "content": "", "tool_calls": [
             {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
         {"role": "tool", "content": '{"temp": 20}', "tool_call_id": "c1"}],
        tools=[{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                                 "parameters": PARAMS}}],
        add_generation_prompt=True, tokenize=False)
    got = _text(enc)
    assert got == want
    assert "TOOLS:get_weather=" in got and "[call c1 get_weather Paris]" in got and "(for c1)" in got
