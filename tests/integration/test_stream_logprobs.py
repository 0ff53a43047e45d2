"""Streamed logprobs with the real `openai` client on the real stack: the chunks' logprobs
joined are the non-stream body's for the same greedy request; a token that is part of a
UTF-8 character reports its own bytes."""

from __future__ import annotations

import uuid

import openai
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "SmolLM2-135M-Instruct"
# NOTE: the second request would find the first's prompt cached: a salt of its own each keeps
# both cold, so the same computation gives the same floats (still compared within 1e-5)
TOL = 1e-5


@pytest.fixture(scope="module")
def client(stack):
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key="unused", timeout=300)


def _cold() -> dict:
    return {"cache_salt": uuid.uuid4().hex}


def _same(streamed, whole) -> None:
    """Equal, floats within TOL (nested dicts and lists as the client dumps them)."""
    if isinstance(whole, float):
        assert streamed == pytest.approx(whole, abs=TOL)
    elif isinstance(whole, dict):
        assert streamed.keys() == whole.keys()
        for key in whole:
            _same(streamed[key], whole[key])
    elif isinstance(whole, list):
        assert len(streamed) == len(whole)
        for a, b in zip(streamed, whole):
            _same(a, b)
    else:
        assert streamed == whole


def test_chat_streamed_logprobs_are_the_non_stream_ones(client):
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": "Name three colours."}],
                  temperature=0, max_tokens=24, logprobs=True, top_logprobs=2)
    whole = client.chat.completions.create(**kwargs, extra_body=_cold())
    chunks = list(client.chat.completions.create(**kwargs, stream=True, extra_body=_cold()))
    content = [e.model_dump() for c in chunks if c.choices and c.choices[0].logprobs
               for e in c.choices[0].logprobs.content]
    want = [e.model_dump() for e in whole.choices[0].logprobs.content]
    assert len(want) == whole.usage.completion_tokens and all(len(e["top_logprobs"]) == 2 for e in want)
    _same(content, want)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content


def test_completion_streamed_logprobs_are_the_non_stream_ones(client):
    kwargs = dict(model=MODEL, prompt="The three primary colours are", temperature=0,
                  max_tokens=16, logprobs=2)
    whole = client.completions.create(**kwargs, extra_body=_cold()).choices[0]
    chunks = [c.choices[0] for c in client.completions.create(**kwargs, stream=True, extra_body=_cold())
              if c.choices]
    want = whole.logprobs.model_dump()
    assert len(want["tokens"]) == 16 and want["text_offset"][0] == 0
    joined = {key: [x for c in chunks if c.logprobs for x in getattr(c.logprobs, key)] for key in want}
    _same(joined, want)
    assert "".join(c.text for c in chunks) == whole.text


def _gpt2_bytes(piece: str) -> bytes:
    """A byte-level BPE piece's bytes: GPT-2's bytes_to_unicode, inverted."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    shifted = [b for b in range(256) if b not in printable]
    inverse = {chr(b): b for b in printable} | {chr(256 + i): b for i, b in enumerate(shifted)}
    return bytes(inverse[ch] for ch in piece)


def test_a_token_that_is_part_of_a_character_reports_its_own_bytes(client, hf_tokenizer):
    """' 日' is two tokens in SmolLM2's byte-level vocabulary: b' \\xe6' then b'\\x97\\xa5'.
    A logit_bias forces the first; alone it is not UTF-8, its text " U+FFFD"."""
    first = hf_tokenizer.encode(" 日")[0]
    own = _gpt2_bytes(hf_tokenizer.convert_ids_to_tokens(first))
    assert own == b" \xe6"
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": "Say something."}],
                  temperature=0, max_tokens=1, logprobs=True, top_logprobs=2,
                  logit_bias={str(first): 100})
    whole = client.chat.completions.create(**kwargs).choices[0].logprobs.content
    streamed = [e for c in client.chat.completions.create(**kwargs, stream=True)
                if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    for entries in (whole, streamed):
        (entry,) = entries
        assert entry.token == " \ufffd" and bytes(entry.bytes) == own  # not U+FFFD's bytes
        # NOTE: logprobs are the model's own (before the bias): the tops are other tokens
        assert all(bytes(t.bytes) == t.token.encode() for t in entry.top_logprobs
                   if "\ufffd" not in t.token)
