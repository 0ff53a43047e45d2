"""Streamed logprobs (LogprobStream, ChoiceStream) and a token's own bytes: the chunks'
logprobs joined are the non-stream body's."""

from __future__ import annotations

from libs.protocol.messages import Logprobs
from services.gateway.chat_stream import ChoiceStream
from services.gateway.formats import OpenAIFormat
from services.gateway.logprobs import (
    LogprobStream, chat_logprobs, legacy_logprobs, merge_logprobs, stream_logprobs,
)
from services.gateway.pipeline import GenerationRequest
from services.gateway.sampling import unresolved

# " 日" is two tokens in a byte-level vocabulary: b" \xe6" then b"\x97\xa5"; alone each
# decodes to U+FFFD, so the tokenizer sends their bytes
PIECES = [
    Logprobs(start=4, token_ids=[10, 11], logprobs=[-0.5, -1.0], top_ids=[[10, 12], [11, 13]],
             top_logprobs=[[-0.5, -2.0], [-1.0, -1.5]], tokens=["Hi", " there"],
             top_tokens=[["Hi", "Yo"], [" there", " you"]]),
    Logprobs(start=6, token_ids=[20], logprobs=[-0.25], top_ids=[[20, 21]],
             top_logprobs=[[-0.25, -3.0]], tokens=["\ufffd"], top_tokens=[["\ufffd", "!"]],
             token_bytes=[b" \xe6"], top_bytes=[[b" \xe6", b"!"]]),
    Logprobs(start=7, token_ids=[22], logprobs=[-0.125], top_ids=[[22, 23]],
             top_logprobs=[[-0.125, -4.0]], tokens=["\ufffd"], top_tokens=[["\ufffd", "."]],
             token_bytes=[b"\x97\xa5"], top_bytes=[[b"\x97\xa5", b"."]]),
]


def test_a_partial_token_shows_its_own_bytes_also_after_a_merge():
    merged = merge_logprobs(PIECES)
    assert merged.token_bytes == [b"Hi", b" there", b" \xe6", b"\x97\xa5"]
    assert merged.top_bytes[0] == [b"Hi", b"Yo"] and merged.top_bytes[3] == [b"\x97\xa5", b"."]
    content = chat_logprobs(merged)["content"]
    assert content[2]["bytes"] == [0x20, 0xE6] and content[3]["bytes"] == [0x97, 0xA5]
    assert bytes(content[2]["bytes"] + content[3]["bytes"]).decode() == " 日"
    assert content[0]["bytes"] == list(b"Hi") and content[3]["top_logprobs"][1]["bytes"] == [46]
    assert merge_logprobs(PIECES[:1]).token_bytes == []  # whole characters: nothing extra sent


def test_chat_chunks_joined_are_the_body():
    stream = LogprobStream(chat=True)
    joined = [e for lp in PIECES for e in stream.body(lp)["content"]]
    assert joined == chat_logprobs(merge_logprobs(PIECES))["content"]


def test_completion_chunks_joined_are_the_body_offsets_going_on():
    stream = LogprobStream(chat=False, with_top=True, prompt_tokens=5)  # position 4: the prompt's
    bodies = [stream.body(lp) for lp in PIECES]
    want = legacy_logprobs(merge_logprobs(PIECES), skip=1)
    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert [x for b in bodies for x in b[key]] == want[key], key
    assert want["text_offset"] == [0, 6, 7]
    assert LogprobStream(chat=False, with_top=False).body(PIECES[0])["top_logprobs"] is None


def test_only_requests_that_show_logprobs_get_a_stream():
    shown = GenerationRequest(text="x", params=unresolved(return_logprob=True, top_logprobs_num=2), show_logprobs=True)
    assert stream_logprobs(shown, chat=False, prompt_tokens=3) == LogprobStream(False, True, 3)
    hidden = GenerationRequest(text="x", params=unresolved(return_logprob=True))  # an echo of ids needs their text only
    assert stream_logprobs(hidden, chat=True, prompt_tokens=3) is None


def test_a_delta_whose_text_is_held_back_still_carries_its_logprobs():
    stream = ChoiceStream(OpenAIFormat("r", "m", chat=True), logprobs=LogprobStream(chat=True))
    held = stream.chunks("", None, PIECES[1])  # part of a character: no text yet
    assert len(held) == 1 and held[0]["choices"][0]["delta"] == {"content": ""}
    assert held[0]["choices"][0]["logprobs"]["content"][0]["bytes"] == [0x20, 0xE6]
    last = stream.chunks(" 日", "stop", PIECES[2])
    assert [c["choices"][0]["delta"] for c in last] == [{"content": " 日"}, {}]
    assert last[0]["choices"][0]["logprobs"] is not None and last[1]["choices"][0]["logprobs"] is None
    plain = ChoiceStream(OpenAIFormat("r", "m", chat=True))  # logprobs not asked for
    assert plain.chunks("", None, PIECES[1]) == []
