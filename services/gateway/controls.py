"""Sampling controls' checks that need more than one field (min_tokens against the token
budget and a regex), and logit_bias' token ids against the vocabulary once the tokenizer
has named it (:func:`check_token_ids`). Ranges are checked by the schema (:mod:`.schemas`),
the fields' forms by :mod:`.sampling`.
"""

from __future__ import annotations

from libs.protocol.errors import invalid_request

from .errors import bad_request
from .request import GenerationRequest


def check_controls(req: GenerationRequest, prefix: str = "", min_tokens_name: str = "min_tokens") -> None:
    """400 for a min_tokens the request cannot honour (after its max_new_tokens and regex are known)."""
    min_tokens, name = req.params.min_tokens, prefix + min_tokens_name
    if min_tokens and req.params.regex:
        raise bad_request(f"{name} and a regex or response_format exclude each other: a "
                          "constrained output ends when it matches", name)
    if req.max_new_tokens is not None and min_tokens > req.max_new_tokens:
        raise bad_request(f"{name} ({min_tokens}) must not exceed the maximum number of "
                          f"tokens ({req.max_new_tokens})", name)


def check_token_ids(req: GenerationRequest, vocab_size: int) -> None:
    """400 (ServiceError) if a logit_bias token id lies past the vocabulary."""
    bias = req.params.logit_bias
    if vocab_size and bias and max(bias) >= vocab_size:
        raise invalid_request(f"logit_bias: token id {max(bias)} out of range [0, {vocab_size})")
