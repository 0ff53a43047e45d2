"""A new row's :class:`SamplingExtras` from a request's :class:`SamplingParams`.

The scheduler calls :func:`row_extras` wherever a request (re)enters a worker row;
only what the features in use need travels (no prompt ids without a repetition
penalty, no output ids without any penalty). A SamplingExtras field named as a
SamplingParams one is copied from it; one that is not at its default makes the row
need its extras (a new worker-side parameter: a field in both, nothing here).
"""

from __future__ import annotations

import msgspec

from .messages import SamplingExtras, SamplingParams

# what the worker needs only beside min_tokens (EOS and stop ids are masked until then)
_CONTEXT = frozenset({"stop_token_ids", "ignore_eos"})
_DEFAULTS = {f.name: f.default for f in msgspec.structs.fields(SamplingParams)}
COPIED = tuple(f for f in SamplingExtras.__struct_fields__ if f in _DEFAULTS and f not in _CONTEXT)


def prefills_locally(s: SamplingParams, prompt_len: int, num_output_tokens: int) -> bool:
    """Whether a decode worker computes this prompt itself instead of a prefill worker:
    a resumed request (its output is replayed there), logprobs or a regex (their state
    lives on the decode worker's rows), a one-token prompt."""
    return bool(num_output_tokens or s.return_logprob or s.regex or prompt_len <= 1)


def uses_extras(s: SamplingParams) -> bool:
    return bool(s.logit_bias) or any(getattr(s, f) != _DEFAULTS[f] for f in COPIED)


def row_extras(s: SamplingParams, prompt_ids: list[int], output_ids: list[int]) -> SamplingExtras | None:
    """None when the request uses none of them (the worker then does no work for it)."""
    if not uses_extras(s):
        return None
    counted = bool(s.presence_penalty or s.frequency_penalty or s.repetition_penalty != 1.0)
    return SamplingExtras(
        **{f: getattr(s, f) for f in COPIED}, prompt_len=len(prompt_ids),
        sample_from=len(prompt_ids) + len(output_ids),
        stop_token_ids=list(s.stop_token_ids) if s.min_tokens else [], ignore_eos=s.ignore_eos,
        bias_ids=[int(k) for k in s.logit_bias], bias_values=[float(v) for v in s.logit_bias.values()],
        prompt_ids=list(prompt_ids) if s.repetition_penalty != 1.0 else [],
        output_ids=list(output_ids) if counted else [],
    )
