"""Token logprobs in the response shapes of OpenAI (legacy completions, chat) and SGLang.

A request's :class:`Logprobs` arrive in pieces (one per delta) covering consecutive
positions; :func:`merge_logprobs` joins them. Position 0 of a prompt has no
logprob (NaN on the bus): it is shown as ``null``, as OpenAI and SGLang do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from libs.protocol.messages import Logprobs


def merge_logprobs(parts: Sequence[Logprobs | None]) -> Logprobs | None:
    """Concatenate consecutive pieces (``None`` ones skipped); None if there are none."""
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    raw = any(p.token_bytes for p in parts)  # NOTE: then every part's, aligned with the tokens
    return Logprobs(
        start=first.start,
        token_ids=[t for p in parts for t in p.token_ids],
        logprobs=[x for p in parts for x in p.logprobs],
        top_ids=[t for p in parts for t in p.top_ids],
        top_logprobs=[t for p in parts for t in p.top_logprobs],
        tokens=[t for p in parts for t in p.tokens],
        top_tokens=[t for p in parts for t in p.top_tokens],
        token_bytes=[_bytes(p, i) for p in parts for i in range(len(p.tokens))] if raw else [],
        top_bytes=[_top_bytes(p, i) for p in parts for i in range(len(p.top_ids))] if raw else [],
    )


def _value(x: float) -> float | None:
    return None if math.isnan(x) else x


def _tops(lp: Logprobs, i: int) -> list[tuple[str, int, float]]:
    """(text, id, logprob) of the likeliest tokens at position i (may be empty)."""
    ids = lp.top_ids[i] if i < len(lp.top_ids) else []
    texts = lp.top_tokens[i] if i < len(lp.top_tokens) else [""] * len(ids)
    values = lp.top_logprobs[i] if i < len(lp.top_logprobs) else []
    return list(zip(texts, ids, values))


def _bytes(lp: Logprobs, i: int) -> bytes:
    """The bytes of the token at position i: its own where the tokenizer sent them (a token
    that is part of a character), else its text's."""
    return lp.token_bytes[i] if lp.token_bytes else lp.tokens[i].encode()


def _top_bytes(lp: Logprobs, i: int) -> list[bytes]:
    if lp.top_bytes and i < len(lp.top_bytes):
        return lp.top_bytes[i]
    return [text.encode() for text, _, _ in _tops(lp, i)]


def legacy_logprobs(lp: Logprobs, skip: int = 0, with_top: bool = True) -> dict:
    """OpenAI /v1/completions ``choices[i].logprobs`` for positions from ``skip`` (an
    index into ``lp``); ``text_offset`` counts characters of the choice's text."""
    tokens = lp.tokens[skip:]
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t)
    top = None
    if with_top:
        top = [None if math.isnan(lp.logprobs[i]) else {text: v for text, _, v in _tops(lp, i)}
               for i in range(skip, len(lp.logprobs))]
    return {"tokens": tokens, "token_logprobs": [_value(x) for x in lp.logprobs[skip:]],
            "top_logprobs": top, "text_offset": offsets}


def chat_logprobs(lp: Logprobs) -> dict:
    """OpenAI chat ``choices[i].logprobs``: one entry per output token, ``bytes`` the
    token's own (a token that is part of a character: not U+FFFD's)."""
    def entry(text: str, value: float, raw: bytes) -> dict:
        return {"token": text, "logprob": value, "bytes": list(raw)}

    content = []
    for i, (text, value) in enumerate(zip(lp.tokens, lp.logprobs)):
        item = entry(text, value, _bytes(lp, i))
        item["top_logprobs"] = [entry(t, v, b) for (t, _, v), b in zip(_tops(lp, i), _top_bytes(lp, i))]
        content.append(item)
    return {"content": content, "refusal": None}


def native_logprobs(lp: Logprobs, prompt_tokens: int) -> dict:
    """SGLang /generate ``meta_info`` entries: [logprob, token id, text] triples split
    into input (prompt) and output tokens, and the top ones when asked for."""
    triples = [[_value(v), t, s] for v, t, s in zip(lp.logprobs, lp.token_ids, lp.tokens)]
    tops = [[[v, t, s] for s, t, v in _tops(lp, i)] for i in range(len(triples))]
    cut = max(0, prompt_tokens - lp.start)
    out = {"input_token_logprobs": triples[:cut], "output_token_logprobs": triples[cut:]}
    if any(tops):
        out.update(input_top_logprobs=tops[:cut], output_top_logprobs=tops[cut:])
    return out


@dataclass
class LogprobStream:
    """One streamed choice's logprobs: each chunk shows its delta's tokens, in the shape of
    the body (:func:`chat_logprobs` / :func:`legacy_logprobs`), so the chunks' lists joined
    are the body's; a completion's ``text_offset`` goes on from the chunk before."""

    chat: bool
    with_top: bool = True  # completions: top_logprobs null when logprobs is 0
    prompt_tokens: int = 0  # positions before it are the prompt's: not shown
    offset: int = 0  # characters of the choice's tokens shown so far

    def body(self, lp: Logprobs | None) -> dict | None:
        """The ``logprobs`` of the chunk that carries ``lp`` (None: no tokens to show)."""
        if lp is None or not lp.token_ids:
            return None
        if self.chat:
            return chat_logprobs(lp)
        body = legacy_logprobs(lp, max(0, self.prompt_tokens - lp.start), self.with_top)
        if not body["tokens"]:
            return None
        body["text_offset"] = [self.offset + at for at in body["text_offset"]]
        self.offset += sum(len(t) for t in body["tokens"])
        return body


def stream_logprobs(req, chat: bool, prompt_tokens: int) -> LogprobStream | None:
    """The LogprobStream of a request (a GenerationRequest) that shows logprobs, else None."""
    if not req.show_logprobs:
        return None
    return LogprobStream(chat, req.params.top_logprobs_num > 0, prompt_tokens)
