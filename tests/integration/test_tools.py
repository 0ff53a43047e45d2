"""Tool calling with the `openai` client and the real default model (SmolLM2-135M
does not call tools by itself: the forced paths are tested here, the parsing of
free outputs in tests/gateway/test_tool_parser.py)."""

from __future__ import annotations

import json

import openai
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "SmolLM2-135M-Instruct"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The current time"}}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]


@pytest.fixture(scope="module")
def client(stack):
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key="unused", timeout=300)


def _check_weather(arguments: str) -> None:
    args = json.loads(arguments)
    assert set(args) == {"city", "unit"} and isinstance(args["city"], str) and len(args["city"]) <= 20
    assert args["unit"] in ("celsius", "fahrenheit")


def test_required_function_call_parses_as_json_matching_the_schema(client):
    resp = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, TIME],
                                          tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                          temperature=0, max_tokens=60)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    _check_weather(call.function.arguments)


def test_required_call_streamed_and_the_result_sent_back(client):
    stream = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required",
                                            temperature=0.7, seed=5, max_tokens=60, stream=True)
    calls, finish, content = [], None, ""
    for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        calls += delta.tool_calls or []
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and content == ""
    [call] = calls
    _check_weather(call.function.arguments)
    follow = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": "get_weather",
                                                         "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "sky": "clear"}'}]
    answer = client.chat.completions.create(model=MODEL, messages=follow, tools=[WEATHER], tool_choice="none",
                                            temperature=0, max_tokens=30)
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls


def test_auto_with_tools_answers(client):
    resp = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], temperature=0, max_tokens=40)
    message = resp.choices[0].message
    assert message.content or message.tool_calls
    assert resp.usage.prompt_tokens > 100  # the tools are in the prompt
