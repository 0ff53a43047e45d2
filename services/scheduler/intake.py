"""Whether a submitted request can ever run on this worker (400s otherwise)."""

from __future__ import annotations

import functools

import numpy as np

from libs.grammar.regex_fsm import RegexError, parse_regex
from libs.protocol import errors
from libs.protocol.limits import MAX_TOP_LOGPROBS
from libs.protocol.messages import WorkerInfo

from .request import Req


def check_request(req: Req, info: WorkerInfo) -> None:
    """Raise ServiceError (400) if ``req`` does not fit the worker's context, KV
    pool or vocabulary, or asks for more top logprobs than it computes."""
    total = req.prompt_len + req.sampling.max_new_tokens
    if total > info.max_model_len:
        raise errors.context_length_exceeded(
            f"prompt ({req.prompt_len}) + max_new_tokens ({req.sampling.max_new_tokens}) "
            f"exceeds the model's context length {info.max_model_len}"
        )
    if total > info.kv_slots:
        raise errors.invalid_request(
            f"request needs up to {total} KV slots; this worker has {info.kv_slots}: "
            "lower max_tokens"
        )
    if not 0 <= req.sampling.top_logprobs_num <= MAX_TOP_LOGPROBS:
        raise errors.invalid_request(f"top_logprobs_num must be in [0, {MAX_TOP_LOGPROBS}]")
    ids = np.asarray(req.input_ids)
    if not len(ids) or ids.min() < 0 or ids.max() >= info.vocab_size:
        raise errors.invalid_request(f"token ids must lie in [0, {info.vocab_size})")
    if req.sampling.regex:
        check_regex(req.sampling.regex)
        if req.sampling.ignore_eos:
            raise errors.invalid_request("regex and ignore_eos exclude each other: a "
                                         "constrained output ends when it matches")
        if not end_ids(req, info.eos_token_ids):
            raise errors.invalid_request("regex needs an end token: the model has no EOS "
                                         "token, so give stop_token_ids")


def end_ids(req: Req, eos: list[int] | frozenset[int]) -> list[int]:
    """The ids that end ``req``: its stop token ids, and EOS unless ignored."""
    ids = set(req.sampling.stop_token_ids)
    if not req.sampling.ignore_eos:
        ids.update(eos)
    return sorted(ids)


@functools.lru_cache(maxsize=256)
def check_regex(pattern: str) -> None:
    """400 unless ``pattern`` is a regex the worker can compile (syntax, supported
    constructs, size: milliseconds). Cached: a pattern is checked once."""
    try:
        parse_regex(pattern)
    except RegexError as exc:
        raise errors.invalid_request(f"regex: {exc}") from None
