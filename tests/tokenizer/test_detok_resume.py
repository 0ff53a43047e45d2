"""A resumed request's detok stream (Detokenizer.prime) continues the text with
no gap and no repeat, at every split point, for multi-byte text and stop strings."""

from __future__ import annotations

import pytest

from services.tokenizer.detok import REPLACEMENT, DecodeState, Detokenizer

TEXTS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "Crème brûlée, naïve café — 你好，世界！東京 👍🏽 🎉 👨‍👩‍👧‍👦 done",
]


@pytest.fixture(scope="module", params=["bytes", "windows"])
def detok(tokenizer, request) -> Detokenizer:
    return Detokenizer(tokenizer, byte_level=request.param == "bytes")


def run(detok, state, ids, finish_last=True):
    out, stopped = [], False
    for i, t in enumerate(ids):
        res = detok.step([state], [[t]], [finish_last and i == len(ids) - 1])[0]
        out.append(res.text)
        if res.stopped:
            stopped = True
            break
    return "".join(out), stopped


def split_run(detok, ids, k, stop=()):
    """Decode ids[:k] on one stream (what the client got), resume on a primed one."""
    first = DecodeState(stop=tuple(stop))
    sent, stopped = run(detok, first, ids[:k], finish_last=False)
    if stopped or k == len(ids):
        return sent, stopped
    second = DecodeState(stop=tuple(stop))
    detok.prime(second, ids[:k], len(sent))
    rest, stopped = run(detok, second, ids[k:])
    return sent + rest, stopped


@pytest.mark.parametrize("text", TEXTS)
def test_resume_at_every_token_matches_an_undisturbed_stream(detok, tokenizer, text):
    ids = tokenizer.encode(text)
    whole, _ = run(detok, DecodeState(), ids)
    assert whole == text
    # NOTE: some split points fall inside a multi-byte character
    split = any(REPLACEMENT in tokenizer.decode(ids[:k]) for k in range(1, len(ids)))
    assert split or text.isascii()
    for k in range(1, len(ids)):
        assert split_run(detok, ids, k)[0] == text, k


def test_stop_string_spanning_the_resume_point(detok, tokenizer):
    text = "Alpha beta gamma delta epsilon"
    ids = tokenizer.encode(text)
    for k in range(1, len(ids)):
        out, stopped = split_run(detok, ids, k, stop=("gamma del",))
        assert stopped and out == "Alpha beta ", k


def test_prime_rejects_undecodable_ids(detok):
    with pytest.raises(ValueError):
        detok.prime(DecodeState(), [-5], 0)


def test_prime_counts_the_replayed_tokens(detok, tokenizer):
    ids = tokenizer.encode("one two three")
    state = DecodeState()
    detok.prime(state, ids, len("one two three"))
    assert state.num_tokens == len(ids)
    res = detok.step([state], [tokenizer.encode(" four")], [True])[0]
    assert res.text == " four"
