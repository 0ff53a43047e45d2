"""Sampling controls of a request body: penalties, min_p, min_tokens, logit_bias.

Ranges are checked by the schema (:mod:`.schemas`); here: what needs more than
one field, and logit_bias' keys (token ids as strings, OpenAI's form). Token ids
are checked against the vocabulary once the tokenizer has named it
(:func:`check_token_ids`).
"""

from __future__ import annotations

from libs.protocol.errors import invalid_request

from .errors import bad_request
from .request import GenerationRequest


def apply_controls(req: GenerationRequest, *, presence: float | None, frequency: float | None,
                   repetition: float | None, min_p: float | None, min_tokens: int | None,
                   logit_bias: dict[str, float] | None, prefix: str = "",
                   min_tokens_name: str = "min_tokens") -> None:
    """Set the controls on ``req`` (after its max_new_tokens and regex are known)."""
    req.presence_penalty = presence or 0.0
    req.frequency_penalty = frequency or 0.0
    req.repetition_penalty = 1.0 if repetition is None else repetition
    req.min_p = min_p or 0.0
    req.min_tokens = min_tokens or 0
    req.logit_bias = _logit_bias(logit_bias or {}, prefix + "logit_bias")
    name = prefix + min_tokens_name
    if req.min_tokens and req.regex:
        raise bad_request(f"{name} and a regex or response_format exclude each other: a "
                          "constrained output ends when it matches", name)
    if req.max_new_tokens is not None and req.min_tokens > req.max_new_tokens:
        raise bad_request(f"{name} ({req.min_tokens}) must not exceed the maximum number of "
                          f"tokens ({req.max_new_tokens})", name)


def _logit_bias(bias: dict[str, float], param: str) -> dict[int, float]:
    out = {}
    for key, value in bias.items():
        if not key.isascii() or not key.isdigit() or len(key) > 10:
            raise bad_request(f"{param} keys must be token ids (non-negative integers as "
                              f"strings); got {key[:32]!r}", param)
        out[int(key)] = float(value)
    return out


def check_token_ids(req: GenerationRequest, vocab_size: int) -> None:
    """400 (ServiceError) if a logit_bias token id lies past the vocabulary."""
    if vocab_size and req.logit_bias and max(req.logit_bias) >= vocab_size:
        raise invalid_request(f"logit_bias: token id {max(req.logit_bias)} out of range "
                              f"[0, {vocab_size})")
