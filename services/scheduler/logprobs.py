"""A request's logprobs: collected from step results, sent out with its next delta."""

from __future__ import annotations

import numpy as np

from libs.protocol.messages import ForwardResult, Logprobs

from .request import Req


def take_logprobs(req: Req, result: ForwardResult, token: int, at: int, count: int,
                  first: int, zero: bool) -> None:
    """Append one step's logprobs of ``req``: ``count`` positions of the result from
    ``at``, for its tokens from index ``first`` (``zero``: token 0, which nothing
    predicts, comes first)."""
    if zero:
        req.lp_pending = Logprobs(start=0, token_ids=[req.input_ids[0]], logprobs=[float("nan")],
                                  top_ids=[[]], top_logprobs=[[]])
    p = req.prompt_len  # NOTE: slices, not fill(): no copy of the whole sequence per step
    ids = (req.input_ids[first : first + count]
           + req.output_ids[max(first - p, 0) : max(first + count - p, 0)])
    ids += [token] * (count - len(ids))  # the last position predicted the sampled token
    lps = result.logprobs[at : at + count]
    top_ids = _top(result.top_ids, result.top_k, at, count, req.sampling.top_logprobs_num)
    top_lps = _top(result.top_logprobs, result.top_k, at, count, req.sampling.top_logprobs_num)
    pending = req.lp_pending
    if pending is None:
        req.lp_pending = Logprobs(start=first, token_ids=ids, logprobs=lps, top_ids=top_ids,
                                  top_logprobs=top_lps)
    else:
        pending.token_ids += ids
        pending.logprobs += lps
        pending.top_ids += top_ids
        pending.top_logprobs += top_lps


def pop_logprobs(req: Req) -> Logprobs | None:
    """What ``req`` collected since its last delta (None: nothing)."""
    out, req.lp_pending = req.lp_pending, None
    return out


def _top(flat: list, k: int, at: int, count: int, want: int) -> list[list]:
    """Rows ``at .. at+count`` of a flattened [positions, k] list, ``want`` columns each."""
    if not (k and want):
        return [[]] * count  # NOTE: never mutated: one shared empty list
    return np.asarray(flat[at * k : (at + count) * k]).reshape(count, k)[:, :want].tolist()
