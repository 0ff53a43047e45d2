"""Token logprobs in the response shapes of OpenAI (legacy completions, chat) and SGLang.

A request's :class:`Logprobs` arrive in pieces (one per delta) covering consecutive
positions; :func:`merge_logprobs` joins them. Position 0 of a prompt has no
logprob (NaN on the bus): it is shown as ``null``, as OpenAI and SGLang do.
"""

from __future__ import annotations

import math
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
    return Logprobs(
        start=first.start,
        token_ids=[t for p in parts for t in p.token_ids],
        logprobs=[x for p in parts for x in p.logprobs],
        top_ids=[t for p in parts for t in p.top_ids],
        top_logprobs=[t for p in parts for t in p.top_logprobs],
        tokens=[t for p in parts for t in p.tokens],
        top_tokens=[t for p in parts for t in p.top_tokens],
    )


def _value(x: float) -> float | None:
    return None if math.isnan(x) else x


def _tops(lp: Logprobs, i: int) -> list[tuple[str, int, float]]:
    """(text, id, logprob) of the likeliest tokens at position i (may be empty)."""
    ids = lp.top_ids[i] if i < len(lp.top_ids) else []
    texts = lp.top_tokens[i] if i < len(lp.top_tokens) else [""] * len(ids)
    values = lp.top_logprobs[i] if i < len(lp.top_logprobs) else []
    return list(zip(texts, ids, values))


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
    """OpenAI chat ``choices[i].logprobs``: one entry per output token."""
    def entry(text: str, value: float) -> dict:
        return {"token": text, "logprob": value, "bytes": list(text.encode())}

    content = []
    for i, (text, value) in enumerate(zip(lp.tokens, lp.logprobs)):
        item = entry(text, value)
        item["top_logprobs"] = [entry(t, v) for t, _, v in _tops(lp, i)]
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
