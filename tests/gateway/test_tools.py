"""tools / tool_choice on chat completions: validation, the prompt's tools, the forced call."""

from __future__ import annotations

import json
import re

import pytest

from .test_routes import CHAT, _error, backend, client  # noqa: F401 - fixtures

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}


async def _accepted(client, backend, **patch):
    await client.post("/v1/chat/completions", json={**CHAT, **patch})
    return backend.requests[-1]


BAD = [
    ({"tool_choice": "auto"}, "tool_choice", "needs tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name", "not among the tools"),
    ({"tools": [WEATHER, WEATHER]}, "tools", "distinct"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
     "tool_choice", "exclude each other"),
    ({"tools": [WEATHER], "tool_choice": "required", "ignore_eos": True}, "tool_choice", "ignore_eos"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name", ""),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "string", "multipleOf": 2}}}}}], "tool_choice": "required"}, "tools[0].function.parameters",
     "multipleOf"),
    ({"tool_choice": "sometimes", "tools": [WEATHER]}, "tool_choice", ""),
    ({"messages": [{"role": "tool", "content": "20C"}]}, "messages[0].tool_call_id", "tool_call_id"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]},
     "messages[0].tool_calls", "assistant"),
]


@pytest.mark.parametrize("patch,param,contains", BAD)
async def test_bad_tool_requests_are_400(client, backend, patch, param, contains):
    _error(await client.post("/v1/chat/completions", json={**CHAT, **patch}), 400, param, contains)
    assert backend.requests == []


async def test_auto_offers_the_tools_and_none_does_not(client, backend):
    auto = await _accepted(client, backend, tools=[WEATHER, TIME])
    assert auto.tool_mode == "auto" and auto.params.regex == ""
    assert [t.name for t in auto.tools] == ["get_weather", "get_time"]
    assert json.loads(auto.tools[0].parameters) == WEATHER["function"]["parameters"]
    none = await _accepted(client, backend, tools=[WEATHER], tool_choice="none")
    assert none.tools == [] and none.tool_mode == ""


async def test_forced_calls_are_constrained_to_the_schema(client, backend):
    named = await _accepted(client, backend, tools=[WEATHER, TIME],
                            tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert named.tool_mode == "forced"
    ok = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'
    assert re.fullmatch(named.params.regex, ok, re.ASCII)
    for bad in (ok.replace('"Paris"', "7"), ok.replace("get_weather", "get_time"),
                '<tool_call>\n{"name": "get_weather", "arguments": {"days": 3}}\n</tool_call>', ok[:-1]):
        assert not re.fullmatch(named.params.regex, bad, re.ASCII), bad
    required = await _accepted(client, backend, tools=[WEATHER, TIME], tool_choice="required")
    assert re.fullmatch(required.params.regex, ok, re.ASCII)
    assert re.fullmatch(required.params.regex, '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>', re.ASCII)


async def test_a_conversation_with_calls_and_results_reaches_the_tokenizer(client, backend):
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 20}'}]
    req = await _accepted(client, backend, tools=[WEATHER], messages=messages)
    assistant, tool = req.messages[1], req.messages[2]
    assert assistant.content == "" and [(c.id, c.name, c.arguments) for c in assistant.tool_calls] == [
        ("call_1", "get_weather", '{"city": "Paris"}')]
    assert (tool.role, tool.tool_call_id, tool.content) == ("tool", "call_1", '{"temp": 20}')
