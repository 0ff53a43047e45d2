"""Regex -> token FSM: hand cases, a brute-force cross-check, errors, token texts, the real vocabulary."""

from __future__ import annotations

import itertools
import json
import re
import time
from collections import defaultdict

import interegular
import numpy as np
import pytest

from libs.grammar.regex_fsm import (
    MAX_STATES,
    RegexCache,
    RegexError,
    Vocab,
    compile_regex,
    parse_regex,
    token_texts,
)

VOCAB = ["a", "b", "ab", "ba", "aab", "B", "1", "12", "-", " ", "x", "é", "\n", None, ""]


def ids(texts: list[str | None], *pieces: str) -> list[int]:
    return [texts.index(p) for p in pieces]


def test_hand_cases():
    fsm = compile_regex("ab|abc", ["a", "b", "ab", "c", "abc", "ba", None, ""])
    assert not fsm.accepting[fsm.start]
    assert fsm.accepting[fsm.walk([2])] and fsm.accepting[fsm.walk([0, 1])]
    assert fsm.accepting[fsm.walk([4])] and fsm.accepting[fsm.walk([2, 3])]
    assert fsm.walk([1]) == -1 and fsm.walk([5]) == -1 and fsm.walk([2, 2]) == -1
    assert (fsm.next_state[:, 6:] == -1).all()  # None and "" are never allowed
    assert fsm.walk([0, 99]) == -1 and fsm.walk([-1]) == -1
    assert fsm.next_state.dtype == np.int16 and fsm.next_state.shape == (fsm.num_states, 8)


def test_token_level_pruning():
    """After 'ab' the regex needs 'c', which no token has: 'ab' must not be allowed at all."""
    fsm = compile_regex("a(bc)?", ["a", "ab"])
    assert fsm.accepting[fsm.walk([0])]
    assert fsm.walk([1]) == -1
    assert fsm.num_states == 2  # start and after-'a'; the state after 'ab' is gone
    with pytest.raises(RegexError, match="no sequence"):
        compile_regex("xyz", ["x", "y"])


def _interegular_reference(pattern: str):
    """A prefix-viability check built from interegular's own FSM (independent of our NFA)."""
    fsm = interegular.parse_pattern(pattern).to_fsm()
    back = defaultdict(set)
    for s, row in fsm.map.items():
        for t in row.values():
            back[t].add(s)
    live, todo = set(fsm.finals), list(fsm.finals)
    while todo:
        for s in back[todo.pop()] - live:
            live.add(s)
            todo.append(s)

    def viable(text: str) -> bool:
        s = fsm.initial
        for ch in text:
            s = fsm.map.get(s, {}).get(fsm.alphabet[ch])
            if s is None or s not in live:
                return False
        return s in live

    return viable


PATTERNS = [
    "a*b?", "(ab|a)(ba|b)*", "[^a]{1,3}", ".?a+", "(?i)AB?|x", r"\d{2}-\d", "a{2,3}|b",
    r"[ab]+( [ab]+)?", "(?s).b", r"\w+", "|ab", "(a|)(b|)1", r"[\s1]*x", "(?i:b)a|B",
]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_brute_force_against_reference(pattern):
    """Every token sequence up to length 3: alive iff a prefix of some match, accepting iff fullmatch."""
    # NOTE: the vocabulary has every single char, so char-level viability equals token-level viability
    fsm = compile_regex(pattern, VOCAB)
    viable = _interegular_reference(pattern)
    real = [i for i, t in enumerate(VOCAB) if t]
    checked = 0
    for n in range(4):
        for seq in itertools.product(real, repeat=n):
            text = "".join(VOCAB[i] for i in seq)
            state = fsm.walk(seq)
            assert (state >= 0) == viable(text), (pattern, text)
            matched = re.fullmatch(pattern, text, re.ASCII) is not None
            assert (state >= 0 and bool(fsm.accepting[state])) == matched, (pattern, text)
            checked += state >= 0
    assert checked > 0
    # every kept state can still finish: it accepts or allows some token
    assert (fsm.accepting | (fsm.next_state >= 0).any(axis=1)).all()


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("", "non-empty"),
        ("a" * 16385, "limit is 16384"),
        ("(a", "invalid regex: missing )"),
        ("a(?=b)", "lookahead"),
        ("(?<=a)b", "lookahead/lookbehind"),
        (r"(a)\1", "backreference"),
        ("(?P<x>a)(?P=x)", "backreference"),
        ("(a)?(?(1)b|c)", "conditional"),
        ("a*+", "possessive"),
        ("(?>a)", "atomic"),
        (r"a\bb", "anchors"),
        ("a^b", "anchors"),
        ("(a|b)*a(a|b){15}", "too complex"),
        ("a{100000}", "too large"),
        ("[\x00-\U0010ffff]", "character classes span"),
        (r"[^\s\S]", "matches nothing"),
        ("(?x)a", "unsupported regex construct"),
        ("(?#note)a", "unsupported regex construct"),
        ("(" * 400 + ")" * 400, "nested too deeply"),
    ],
)
def test_regex_errors(pattern, message):
    t0 = time.perf_counter()
    with pytest.raises(RegexError, match=re.escape(message)):
        parse_regex(pattern)
    assert time.perf_counter() - t0 < 2.0
    assert issubclass(RegexError, ValueError)


def test_max_states_is_enforced_and_configurable():
    assert parse_regex("a{0,1023}").num_states == 1024 == MAX_STATES
    with pytest.raises(RegexError, match="too complex"):
        parse_regex("a{0,1024}")
    with pytest.raises(RegexError, match="too complex"):
        parse_regex("a{0,20}", max_states=8)


def test_anchors_and_escapes():
    texts = ["a", "b", "$", "\\", "A", "é", "."]
    plain = compile_regex("ab", texts)
    for anchored in ("^ab$", r"\Aab\Z", "^ab", "ab$"):
        fsm = compile_regex(anchored, texts)
        assert np.array_equal(fsm.next_state, plain.next_state) and fsm.start == plain.start
    dollar = compile_regex(r"a\$", texts)  # escaped: a literal '$'
    assert dollar.accepting[dollar.walk([0, 2])] and dollar.walk([0]) >= 0
    backslash = compile_regex(r"a\\$", texts)  # a literal backslash, then the end anchor
    assert backslash.accepting[backslash.walk([0, 3])]
    for pattern in (r"\u0041\u00e9", r"\U00000041\N{LATIN SMALL LETTER E WITH ACUTE}", r"[\u0041-\u0042]é"):
        fsm = compile_regex(pattern, texts)
        assert fsm.accepting[fsm.walk([4, 5])], pattern
    dot = compile_regex(r"a\u002e", texts)  # an escaped code point of a special char stays literal
    assert dot.accepting[dot.walk([0, 6])] and dot.walk([0, 1]) == -1


def test_vocab_is_reusable_and_matches_list():
    vocab = Vocab(VOCAB)
    assert vocab.size == len(VOCAB) and vocab.lengths[0] == 3
    for pattern in PATTERNS[:4]:
        a, b = compile_regex(pattern, vocab), compile_regex(pattern, VOCAB)
        assert np.array_equal(a.next_state, b.next_state) and np.array_equal(a.accepting, b.accepting)


def test_regex_cache_lru_by_bytes():
    cache = RegexCache(VOCAB, max_bytes=10**6)
    first = cache.get("a*")
    assert cache.get("a*") is first and "a*" in cache
    per = first.nbytes
    small = RegexCache(VOCAB, max_bytes=2 * compile_regex("b*", VOCAB).nbytes)
    a = small.get("a*")
    small.get("b*")
    small.get("a*")  # touch: "b*" is now the oldest
    small.get("x*")
    assert "b*" not in small and "a*" in small and "x*" in small and small.get("a*") is a
    assert small.nbytes <= small.max_bytes and len(small) == 2
    tiny = RegexCache(VOCAB, max_bytes=per - 1)
    assert tiny.get("a*").num_states == first.num_states and len(tiny) == 0  # too big to keep
    with pytest.raises(RegexError):
        cache.get("(a")
    assert len(cache) == 1


# ---- real tokenizers ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm():
    transformers = pytest.importorskip("transformers")
    from libs.models import resolve_model

    path = resolve_model("default")
    tok = transformers.AutoTokenizer.from_pretrained(path)
    vocab_size = json.loads((path / "config.json").read_text())["vocab_size"]
    return tok, token_texts(tok, vocab_size)


def test_token_texts_byte_level(smollm):
    tok, texts = smollm
    assert len(texts) == 49152
    added = set(tok.added_tokens_decoder) | set(tok.all_special_ids)
    assert len(added) == 17 and all(texts[i] is None for i in added)
    assert texts[tok.convert_tokens_to_ids("Ġthe")] == " the"
    assert texts[tok.convert_tokens_to_ids("Ċ")] == "\n"
    assert texts[tok.convert_tokens_to_ids("Ã")] is None  # byte 0xC3 alone: half of a 2-byte char
    assert texts[tok.convert_tokens_to_ids("Ã©")] == "é"
    assert token_texts(tok, len(tok) + 3)[-3:] == [None] * 3
    # every whole-char token decodes by itself to exactly its text
    some = [i for i, t in enumerate(texts) if t is not None][::7]
    assert tok.batch_decode([[i] for i in some]) == [texts[i] for i in some]
    partial = [i for i, t in enumerate(texts[:len(tok)]) if t is None and i not in added]
    assert partial and all("\ufffd" in s for s in tok.batch_decode([[i] for i in partial]))


def test_token_texts_sentencepiece_style():
    """A small Llama-style tokenizer (Metaspace '▁', byte fallback, Strip decoder), built offline."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

    pieces = ["<unk>", "<s>", "</s>", "<0x0A>", "<0xE2>", "<0x41>"]
    pieces += ["▁", "a", "b", "▁a", "ab", "▁ab", "é", "▁▁"]
    merges = [("▁", "a"), ("a", "b"), ("▁a", "b"), ("▁", "▁")]
    tk = Tokenizer(models.BPE({p: i for i, p in enumerate(pieces)}, merges, unk_token="<unk>", byte_fallback=True))
    tk.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tk.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tk.add_special_tokens([AddedToken(t, special=True) for t in ("<unk>", "<s>", "</s>")])
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>")
    texts = token_texts(tok, 16)
    assert texts == [None, None, None, "\n", None, "A", " ", "a", "b", " a", "ab", " ab", "é", "  ", None, None]
    anchor = pieces.index("▁a")  # decoded after another token, so the leading-space Strip does not apply
    for i, text in enumerate(texts[:14]):
        if text is not None:
            assert tok.decode([anchor, i])[1:] == text


def test_real_vocab_date(smollm):
    tok, texts = smollm
    vocab = Vocab(texts)
    fsm = compile_regex(r"\d{4}-\d{2}-\d{2}", vocab)
    enc = lambda s: tok.encode(s, add_special_tokens=False)
    assert fsm.accepting[fsm.walk(enc("2024-05-17"))]
    state = fsm.walk(enc("2024-5"))
    assert state >= 0 and not fsm.accepting[state]
    assert fsm.walk(enc("-"), state) == -1  # the month needs two digits
    assert fsm.walk(enc("2024-05-17") + enc("1")) == -1 and fsm.walk(enc("x")) == -1
    # from the start: exactly the tokens made of 1-4 digits
    allowed = set(np.flatnonzero(fsm.next_state[fsm.start] >= 0).tolist())
    digits = {i for i, t in enumerate(texts) if t and re.fullmatch(r"[0-9]{1,4}", t)}
    assert allowed == digits and digits
    assert (fsm.next_state[:, tok.eos_token_id] == -1).all()


@pytest.mark.parametrize(
    "pattern",
    [
        r"[A-Z][a-z]+( [A-Z][a-z]+)*",
        r"[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,4}",
        r'\{"name": "[^"]{1,20}", "age": \d{1,3}\}',
    ],
)
def test_real_vocab_random_walks(smollm, pattern):
    """Random allowed tokens, then a shortest way home: prefixes stay viable, every end fully matches."""
    _, texts = smollm
    fsm = compile_regex(pattern, texts)
    viable = _interegular_reference(pattern)
    dist = np.where(fsm.accepting, 0.0, np.inf)  # tokens still needed to reach acceptance
    for _ in range(fsm.num_states):
        dist = np.minimum(dist, np.where(fsm.next_state >= 0, dist[fsm.next_state], np.inf).min(axis=1) + 1)
    assert np.isfinite(dist).all()  # every kept state can finish
    rng = np.random.default_rng(0)
    for _ in range(20):
        state, text = fsm.start, ""
        for step in range(200):
            if fsm.accepting[state] and rng.random() < 0.2:
                break
            ok = fsm.next_state[state] >= 0
            if step >= 20:  # head home
                ok &= dist[fsm.next_state[state]] == dist[state] - 1
            if not ok.any():
                break
            token = int(rng.choice(np.flatnonzero(ok)))
            state, text = int(fsm.next_state[state, token]), text + texts[token]
            assert viable(text), text
        assert fsm.accepting[state] and re.fullmatch(pattern, text), text
