"""The short way to a streamed text chunk gives the same bytes as the chunk built and encoded."""

import pytest

from services.gateway.chat_stream import ChoiceStream
from services.gateway.formats import OpenAIFormat
from services.gateway.sse import parse_sse, sse_event

TEXTS = ["hello", "", ' "quoted" \\ back', "tab\tnew\nline \x00 \x1f", "héllo wörld 你好 🙂", "\ufffd"]


@pytest.mark.parametrize("chat", [True, False])
@pytest.mark.parametrize("include_usage", [True, False])
@pytest.mark.parametrize("index", [0, 3])
def test_text_event_is_the_encoded_chunk(chat, include_usage, index):
    fmt = OpenAIFormat("rid-1", "model \"x\"", chat, include_usage)
    for text in TEXTS:
        assert fmt.text_event(text, index) == sse_event(fmt.chunk(text, index=index))


def test_events_take_the_short_way_only_for_plain_text():
    fmt = OpenAIFormat("r", "m", chat=True)
    stream = ChoiceStream(fmt)
    assert stream.events("", None) == []
    assert stream.events("ab", None) == [fmt.text_event("ab")]
    last = stream.events("c", "length")
    assert [sse_event(c) for c in stream.chunks("c", "length")] == last
    assert parse_sse(b"".join(last))[-1]["choices"][0]["finish_reason"] == "length"
