"""A logprob token that is part of a UTF-8 character reports its own bytes (the default
model's byte-level vocabulary), not U+FFFD's; whole characters add nothing to the wire."""

from __future__ import annotations

import msgspec
import pytest

from libs.grammar.token_texts import piece_bytes
from libs.protocol.messages import DetokBatch, Logprobs, TokenDelta
from services.tokenizer.detok import Detokenizer
from services.tokenizer.streams import Streams


@pytest.fixture(scope="module")
def partial_id(tokenizer) -> int:
    """The first id of the vocabulary whose bytes alone are not valid UTF-8."""
    raw = piece_bytes(tokenizer.backend_tokenizer.decoder)
    for i in range(len(tokenizer)):
        data = raw(tokenizer.backend_tokenizer.id_to_token(i))
        try:
            data.decode()
        except UnicodeDecodeError:
            return i
    pytest.fail("no partial-character token in the vocabulary")


def test_the_bytes_of_a_character_split_in_tokens_are_the_tokens_bytes(tokenizer):
    detok = Detokenizer(tokenizer)
    ids = tokenizer.encode(" 日本語")
    texts = detok.token_texts(ids)
    assert "\ufffd" in "".join(texts)  # some token alone is part of a character
    raw = detok.token_bytes(ids, texts)
    assert b"".join(raw) == " 日本語".encode()
    assert detok.token_bytes(tokenizer.encode("Hello world"), ["Hello", " world"]) is None


def test_a_step_sends_the_bytes_of_a_partial_token_and_its_top_tokens(tokenizer, partial_id):
    streams = Streams(Detokenizer(tokenizer))
    streams.open("r", "gw", 3, [], True)
    hi = tokenizer.encode("Hi")[0]
    lp = Logprobs(start=3, token_ids=[partial_id, hi], logprobs=[-1.0, -2.0],
                  top_ids=[[partial_id, hi], [hi, partial_id]], top_logprobs=[[-1.0, -3.0], [-2.0, -4.0]])
    out = streams.step(DetokBatch(worker_id="w", step=1, items=[
        TokenDelta(rid="r", token_ids=[partial_id, hi], logprobs=lp)]))
    (delta,) = out.per_gateway["gw"]
    own = piece_bytes(tokenizer.backend_tokenizer.decoder)(
        tokenizer.backend_tokenizer.id_to_token(partial_id))
    assert delta.logprobs.tokens[0] == "\ufffd" and delta.logprobs.token_bytes == [own, b"Hi"]
    assert delta.logprobs.top_bytes == [[own, b"Hi"], [b"Hi", own]]
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(delta.logprobs), type=Logprobs)
    assert wire.token_bytes == [own, b"Hi"]


def test_whole_characters_leave_the_bytes_empty(tokenizer):
    streams = Streams(Detokenizer(tokenizer))
    streams.open("r", "gw", 3, [], True)
    ids = tokenizer.encode("Hi there")
    lp = Logprobs(start=3, token_ids=ids, logprobs=[-1.0] * len(ids))
    out = streams.step(DetokBatch(worker_id="w", step=1, items=[TokenDelta(rid="r", token_ids=ids, logprobs=lp)]))
    (delta,) = out.per_gateway["gw"]
    assert delta.logprobs.token_bytes == [] and delta.logprobs.top_bytes == []
