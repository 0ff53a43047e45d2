"""Hermes tool calls parsed out of outputs, whole and streamed."""

from __future__ import annotations

import json

import pytest

from services.gateway.chat_stream import ChoiceStream
from services.gateway.formats import OpenAIFormat
from services.gateway.tool_parser import ToolCallParser, parse_output

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'


def _calls(text):
    content, calls = parse_output(text)
    return content, [(c.name, json.loads(c.arguments)) for c in calls]


def test_a_call_and_the_content_around_it():
    assert _calls(CALL) == (None, [("get_weather", {"city": "Paris", "days": 2})])
    assert _calls("Let me check.\n" + CALL + "\n") == ("Let me check.", [("get_weather", {"city": "Paris", "days": 2})])
    two = CALL + "\n" + CALL.replace("Paris", "Oslo")
    assert [a["city"] for _, a in _calls(two)[1]] == ["Paris", "Oslo"]


@pytest.mark.parametrize("text", [
    "no tools here",
    "<tool_call>not json</tool_call>",
    '<tool_call>{"arguments": {}}</tool_call>',  # no name
    '<tool_call>["get_weather"]</tool_call>',
    '<tool_call>{"name": "f", "arguments": 5}</tool_call>',
])
def test_what_is_not_a_call_stays_content(text):
    assert _calls(text) == (text, [])


def test_arguments_as_a_json_string_and_an_unclosed_call():
    assert _calls('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>')[1] == [("f", {"x": 1})]
    assert _calls('<tool_call>{"name": "f", "arguments": {}}')[1] == [("f", {})]  # stopped before the tag
    assert _calls("<tool_call>{\"name\": \"f\"")[0] == '<tool_call>{"name": "f"'


@pytest.mark.parametrize("text", ["Sure: " + CALL + " done", CALL + CALL, "a <tool b <tool_call c", "x " * 5 + CALL])
def test_streamed_in_any_pieces_equals_whole(text):
    whole = ToolCallParser()
    want = whole.feed(text) + whole.finish()
    for size in (1, 2, 3, 7):
        parser = ToolCallParser()
        got = [e for i in range(0, len(text), size) for e in parser.feed(text[i:i + size])] + parser.finish()
        joined = "".join(v for k, v in got if k == "content")
        assert joined == "".join(v for k, v in want if k == "content")
        assert [(v.name, v.arguments) for k, v in got if k == "call"] == \
            [(v.name, v.arguments) for k, v in want if k == "call"]


def test_the_tag_is_never_streamed_as_content():
    parser = ToolCallParser()
    out = []
    for ch in "Hi <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>":
        out += parser.feed(ch)
    assert all("<" not in v for k, v in out if k == "content")
    assert "".join(v for k, v in out if k == "content") == "Hi" and out[-1][0] == "call"


def test_choice_stream_chunks_carry_tool_call_deltas_and_finish_tool_calls():
    stream = ChoiceStream(OpenAIFormat("r", "m", chat=True), index=2, tools=True)
    chunks = []
    for piece in ("Checking", ". ", CALL[:20], CALL[20:]):
        chunks += stream.chunks(piece, None)
    chunks += stream.chunks("", "stop")
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("content", "") for d in deltas) == "Checking."  # the space before the call dropped
    [call] = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert call["index"] == 0 and call["type"] == "function" and call["id"].startswith("call_")
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris", "days": 2}
    assert chunks[-1]["choices"][0] == {"index": 2, "delta": {}, "logprobs": None, "finish_reason": "tool_calls"}


def test_without_tools_text_passes_through():
    stream = ChoiceStream(OpenAIFormat("r", "m", chat=True))
    chunks = stream.chunks(CALL, "stop")
    assert chunks[0]["choices"][0]["delta"] == {"content": CALL}
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_a_chat_response_with_tools_lists_the_calls():
    from libs.protocol.messages import Usage
    from services.gateway.generation import Completion
    from services.gateway.request import GenerationRequest

    done = Completion("r", "On it. " + CALL, [1], "stop", Usage(prompt_tokens=3, completion_tokens=1))
    fmt = OpenAIFormat("r", "m", chat=True)
    [choice] = fmt.response(done, GenerationRequest(text="x", tool_mode="auto"))["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "On it."
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    [plain] = fmt.response(done, GenerationRequest(text="x"))["choices"]
    assert plain["message"] == {"role": "assistant", "content": done.text} and plain["finish_reason"] == "stop"
