"""Incremental detokenization and stop strings against the real default tokenizer."""

from __future__ import annotations

import random
import string

import pytest

from services.tokenizer.detok import (
    REPLACEMENT, DecodeState, Detokenizer, StepResult, find_stop, partial_stop_len,
)

TEXTS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "Crème brûlée, naïve café, Ångström, São Paulo, Łódź, ñandú.",
    "你好，世界！今天天气很好。我们去公园散步吧。東京と大阪",
    "Emoji: 👍🏽 🎉🎉 👨‍👩‍👧‍👦 🇫🇷 ❤️‍🔥 and 🤖 done",
    "Mixed: Привет мир — κόσμε — مرحبا — שלום — 안녕하세요 ∑∫√∞",
    "def f(x):\n    return x ** 2  # squares\n\n\tTabs\tand  double  spaces",
]


@pytest.fixture(scope="module", params=["bytes", "windows"])
def detok(tokenizer, request) -> Detokenizer:
    """Both paths of the byte-level default tokenizer: token bytes, and decoded windows."""
    return Detokenizer(tokenizer, byte_level=request.param == "bytes")


def test_byte_level_tokenizer_takes_the_byte_path(tokenizer):
    assert Detokenizer(tokenizer)._bytes is not None
    assert Detokenizer(byte_fallback_tokenizer())._bytes is None


def window(detok, state) -> int:
    """Tokens (windows) or bytes (byte path) a state keeps undecided."""
    return len(state.pending) if detok._bytes is not None else len(state.output_ids) - state.prefix_offset


def feed(detok, ids, chunks=None, stop=(), skip=True):
    """Feed ``ids`` in chunks (sizes from ``chunks``, default 1); returns the StepResults."""
    state = DecodeState(skip_special_tokens=skip, stop=tuple(stop))
    sizes = iter(chunks or [])
    results, pos = [], 0
    while pos < len(ids) or not results:
        n = next(sizes, 1)
        chunk = ids[pos:pos + n]
        pos += len(chunk)
        results.append(detok.step([state], [chunk], [pos >= len(ids)])[0])
        if results[-1].stopped:
            break
    return results


def joined(results: list[StepResult]) -> str:
    return "".join(r.text for r in results)


@pytest.mark.parametrize("text", TEXTS)
def test_multibyte_text_is_never_split_or_garbled(detok, tokenizer, text):
    ids = tokenizer.encode(text)
    results = feed(detok, ids)
    assert all(REPLACEMENT not in r.text for r in results)
    assert joined(results) == text == tokenizer.decode(ids)
    # the text really does split characters across tokens: holding back was needed
    assert any(REPLACEMENT in tokenizer.decode([t]) for t in ids) or text.isascii()


@pytest.mark.parametrize("skip", [True, False])
def test_random_token_sequences_concatenate_to_decode(detok, tokenizer, skip):
    rng = random.Random(1234 + skip)
    vocab = len(tokenizer)
    for _ in range(300):
        n = rng.randint(1, 40)
        ids = [rng.randrange(vocab) if rng.random() > 0.1 else rng.randrange(17) for _ in range(n)]
        chunks = [rng.randint(1, 3) for _ in range(n)]
        results = feed(detok, ids, chunks, skip=skip)
        assert joined(results) == tokenizer.decode(ids, skip_special_tokens=skip), ids
        assert all(not r.text.endswith(REPLACEMENT) for r in results[:-1]), ids


@pytest.mark.parametrize("skip", [True, False])
def test_byte_path_emits_the_same_deltas_as_windows(tokenizer, skip):
    """Not only the same text in all: the same text at every step (the stream's chunks)."""
    fast, slow = Detokenizer(tokenizer), Detokenizer(tokenizer, byte_level=False)
    rng = random.Random(77 + skip)
    for _ in range(300):
        n = rng.randint(1, 40)
        # NOTE: ids past the vocabulary (a model's padded embedding) decode to nothing
        ids = [rng.randrange(len(tokenizer) + 64) if rng.random() > 0.1 else rng.randrange(17) for _ in range(n)]
        chunks = [rng.randint(1, 3) for _ in range(n)]
        stop = ["".join(rng.choice("etaoin ") for _ in range(rng.randint(1, 3)))] if rng.random() < 0.3 else []
        assert feed(fast, ids, chunks, stop, skip) == feed(slow, ids, chunks, stop, skip), ids


def test_skip_special_tokens(detok, tokenizer):
    ids = tokenizer.encode("Hi") + [tokenizer.eos_token_id] + tokenizer.encode(" there")
    assert joined(feed(detok, ids, skip=True)) == "Hi there"
    assert joined(feed(detok, ids, skip=False)) == "Hi<|im_end|> there"


def test_stop_string_across_token_boundaries(detok, tokenizer):
    text = "The answer is 42. END OF ANSWER and more text after it"
    stop = "END OF ANSWER"
    ids = tokenizer.encode(text)
    assert not any(stop in tokenizer.decode([t]) for t in ids)  # spans several tokens
    results = feed(detok, ids, stop=[stop])
    assert results[-1].stopped and len(results) < len(ids)
    assert joined(results) == "The answer is 42. "


def test_stop_string_text_is_never_emitted(detok, tokenizer):
    rng = random.Random(7)
    for _ in range(200):
        text = rng.choice(TEXTS)
        start = rng.randrange(len(text))
        stops = [text[start:start + rng.randint(1, 6)], rng.choice(["zzz", "😀x", "Ω"])]
        expected = text[:find_stop(text, stops)]
        emitted = ""
        for r in feed(detok, tokenizer.encode(text), [rng.randint(1, 3) for _ in text], stops):
            emitted += r.text
            assert expected.startswith(emitted), (text, stops, emitted)
        assert emitted == expected and r.stopped


def test_earliest_of_several_stop_strings_wins(detok, tokenizer):
    ids = tokenizer.encode("alpha beta gamma delta")
    results = feed(detok, ids, stop=["delta", "beta", "gam"])
    assert joined(results) == "alpha " and results[-1].stopped


def test_held_back_stop_prefix_is_flushed_at_finish(detok, tokenizer):
    ids = tokenizer.encode("We reached the en")
    results = feed(detok, ids, stop=["the end"])
    assert joined(results[:-1]) == "We reached "
    assert joined(results) == "We reached the en" and not results[-1].stopped


def test_incomplete_character_is_flushed_at_finish(detok, tokenizer):
    ids = tokenizer.encode("ok 👍")[:-1]  # cut inside the emoji's bytes
    results = feed(detok, ids)
    assert joined(results) == tokenizer.decode(ids) and joined(results).endswith(REPLACEMENT)
    assert not joined(results[:-1]).endswith(REPLACEMENT)


def test_batched_step_equals_separate_requests(detok, tokenizer):
    ids = [tokenizer.encode(t) for t in TEXTS]
    states = [DecodeState(skip_special_tokens=i % 2 == 0, stop=("ld",) if i == 0 else ())
              for i in range(len(ids))]
    outs = [""] * len(ids)
    for step in range(max(map(len, ids))):
        new = [seq[step:step + 1] for seq in ids]
        fin = [step == len(seq) - 1 for seq in ids]
        for i, r in enumerate(detok.step(states, new, fin)):
            outs[i] += r.text
    assert outs == [joined(feed(detok, seq, stop=st.stop)) for seq, st in zip(ids, states)]
    assert outs[0] == "Hello, wor"


def test_windows_stay_short_for_long_outputs(detok, tokenizer):
    ids = tokenizer.encode(" ".join(TEXTS) * 10)
    state = DecodeState()
    widest = 0
    for t in ids:
        detok.step([state], [[t]], [False])
        widest = max(widest, window(detok, state))
    assert len(ids) > 1000 and widest <= 8


def test_bad_ids_fail_only_their_request(detok, tokenizer):
    good, bad = DecodeState(), DecodeState()
    results = detok.step([good, bad], [tokenizer.encode("fine"), [5, -3]], [False, False])
    assert results[0] == StepResult("fine", False)
    assert results[1].error and bad.stopped


def test_stop_helpers():
    assert find_stop("abcabc", ["ca", "bc"]) == 1
    assert find_stop("abc", ["x"]) == -1
    assert partial_stop_len("hello wor", ["world", "or!"]) == 3
    assert partial_stop_len("hello", ["lo"]) == 0  # a full match is not a partial one
    assert partial_stop_len("x", []) == 0


def test_partial_stop_len_matches_brute_force():
    rng = random.Random(3)
    for _ in range(2000):
        text = "".join(rng.choice("ab😀") for _ in range(rng.randint(0, 8)))
        stop = ["".join(rng.choice("ab😀") for _ in range(rng.randint(1, 5))) for _ in range(2)]
        brute = max([k for s in stop for k in range(1, len(s)) if text.endswith(s[:k])], default=0)
        assert partial_stop_len(text, stop) == brute, (text, stop)


def test_runs_of_skipped_special_tokens_keep_windows_short(detok, tokenizer):
    state = DecodeState(skip_special_tokens=True)
    ids = tokenizer.encode("Hi") + [tokenizer.eos_token_id] * 500 + tokenizer.encode(" there")
    text = "".join(r.text for r in (detok.step([state], [[t]], [False])[0] for t in ids))
    assert text == "Hi there" and state.num_tokens == len(ids)
    assert window(detok, state) <= 4


def byte_fallback_tokenizer():
    """A Llama-2-style tokenizer (Metaspace, <0xXX> byte fallback, Strip) built in memory."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for piece in ["\u2581", "\u2581Hello", "\u2581world", "\u2581the", "é", "你", *string.printable.strip()]:
        vocab.setdefault(piece, len(vocab))
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    backend.normalizer = normalizers.Sequence(
        [normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")]
    )
    backend.decoder = decoders.Sequence([
        decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
        decoders.Strip(" ", 1, 0),
    ])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


@pytest.mark.parametrize("skip", [True, False])
def test_byte_fallback_metaspace_tokenizer(skip):
    tok = byte_fallback_tokenizer()
    detok = Detokenizer(tok)
    rng = random.Random(11)
    pieces = list("Helo wrd!,é你好👍🏽ab ") + ["Hello", " the", " world"]
    for _ in range(300):
        parts = ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 6))) for _ in range(2)]
        first, second = (tok.encode(p, add_special_tokens=False) for p in parts)
        if skip:  # a skipped special token may land anywhere, even inside a character
            ids = first + second
            ids.insert(rng.randrange(len(ids) + 1), tok.eos_token_id)
        else:
            ids = first + [tok.eos_token_id] + second
        results = feed(detok, ids, [rng.randint(1, 3) for _ in ids], skip=skip)
        assert joined(results) == tok.decode(ids, skip_special_tokens=skip), ids
        assert all(REPLACEMENT not in r.text for r in results), ids
