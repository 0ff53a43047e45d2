"""Request bodies -> :class:`SamplingParams`: every sampling parameter is declared once.

SamplingParams (libs/protocol/messages.py) is the list. The bodies (schemas.py) say how
HTTP accepts each: a body field with a SamplingParams name is copied as it is (None:
SamplingParams' default), through a converter where its HTTP form differs (:data:`CONVERT`),
or from SGLang's name (:data:`ALIASES`). The few whose value takes more than one field are
named in :data:`DERIVED` and :data:`OPENAI_LOGPROBS`; a body field that is no sampling
parameter is named in :data:`REQUEST_FIELDS`. tests/gateway/test_sampling_fields.py fails for
a field outside these, and sends every field through every body.

Adding a sampling parameter: the field in SamplingParams, its body fields in schemas.py, the
code that acts on it, docs/api.md; nothing here unless its HTTP form needs a converter.
"""

from __future__ import annotations

import msgspec

from libs.protocol.messages import SamplingParams

from .errors import bad_request

UNRESOLVED = 0  # NOTE: max_new_tokens is resolved at submit (GenerationRequest.sampling)
PARAMS = frozenset(SamplingParams.__struct_fields__)


def unresolved(**fields) -> SamplingParams:
    """SamplingParams of ``fields``, its max_new_tokens left for the submit to resolve."""
    return SamplingParams(max_new_tokens=UNRESOLVED, **fields)


# /generate's sampling_params under SGLang's names -> the SamplingParams field
ALIASES = {"min_new_tokens": "min_tokens"}
# SamplingParams fields whose value takes more than a body field of their name: field -> who sets it
DERIVED = {
    "max_new_tokens": "max_tokens / max_completion_tokens / max_new_tokens, capped (routes.py)",
    "regex": "regex, response_format or json_schema, a forced tool_choice (convert.py, tools.py)",
}
# what OpenAI's bodies spell their own way (logprobs, top_logprobs, echo: convert.py); /generate's
# carry them by name
OPENAI_LOGPROBS = frozenset({"return_logprob", "logprob_start_len", "top_logprobs_num"})
# body fields that are no sampling parameter: the prompt, routing, output form, limits
REQUEST_FIELDS = frozenset({
    "model", "messages", "prompt", "text", "input_ids", "rid", "stream", "stream_options", "n", "user",
    "cache_salt", "timeout", "echo", "suffix", "logprobs", "top_logprobs", "response_format", "tools",
    "tool_choice", "parallel_tool_calls", "max_tokens", "max_completion_tokens", "max_new_tokens",
    "json_schema", "sampling_params",
})


def _top_k(top_k: int, param: str) -> int:
    if top_k in (0, -1):
        return -1
    if top_k < 1:
        raise bad_request(f"{param} must be -1 (disabled) or >= 1", param)
    return top_k


def _stop(stop: str | list[str], param: str) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop)
    if any(s == "" for s in stops):
        raise bad_request("stop strings must not be empty", param)
    return stops


def _logit_bias(bias: dict[str, float], param: str) -> dict[int, float]:
    out = {}
    for key, value in bias.items():
        if not key.isascii() or not key.isdigit() or len(key) > 10:
            raise bad_request(f"{param} keys must be token ids (non-negative integers as "
                              f"strings); got {key[:32]!r}", param)
        out[int(key)] = float(value)
    return out


# the HTTP form -> SamplingParams' (value, param name for a 400)
CONVERT = {"top_k": _top_k, "stop": _stop, "logit_bias": _logit_bias}


def sampling_params(*bodies: tuple[msgspec.Struct, str]) -> SamplingParams:
    """The SamplingParams of ``(body, param prefix)`` pairs' fields (max_new_tokens unresolved,
    the DERIVED fields left for the caller): each field in SamplingParams, by its name or an
    alias, copied unless None."""
    values = {}
    for body, prefix in bodies:
        for name in body.__struct_fields__:
            field = ALIASES.get(name, name)
            value = getattr(body, name)
            if field not in PARAMS or field in DERIVED or value is None:
                continue
            values[field] = CONVERT[field](value, prefix + name) if field in CONVERT else value
    return unresolved(**values)
