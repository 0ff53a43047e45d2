"""Validate a ForwardBatch and turn it into host arrays (numpy), vectorised."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from libs.protocol.errors import invalid_request
from libs.protocol.limits import MAX_TOP_LOGPROBS
from libs.protocol.messages import ForwardBatch, NewRow

from .sampling.penalties import check_extras


@dataclass(frozen=True)
class Limits:
    max_requests: int
    max_model_len: int
    kv_slots: int
    vocab_size: int


@dataclass(frozen=True)
class StepArrays:
    """One step's inputs; ``token_rows`` / ``positions`` are per token, the rest per request."""

    rows: np.ndarray
    prefix_lens: np.ndarray
    extend_lens: np.ndarray
    input_ids: np.ndarray
    out_slots: np.ndarray
    token_rows: np.ndarray
    positions: np.ndarray
    shared_rows: np.ndarray  # new rows starting from cached KV: table[row, pos] = slot
    shared_positions: np.ndarray
    shared_slots: np.ndarray
    future: np.ndarray  # token indices whose id is -1: the row's token sampled last step

    @property
    def seq_lens(self) -> np.ndarray:
        return self.prefix_lens + self.extend_lens

    @property
    def last_index(self) -> np.ndarray:
        return np.cumsum(self.extend_lens) - 1


@dataclass(frozen=True)
class LogprobPlan:
    """Where one step wants next-token logprobs, flattened over its positions.

    ``index``: token index in the step's flat input; ``owner``: batch index of its
    request; ``target``: the token whose logprob is wanted (-1: the token sampled
    for ``owner`` this step). ``top_k``: likeliest tokens to list per position.
    """

    index: np.ndarray
    owner: np.ndarray
    target: np.ndarray
    top_k: int

    def __len__(self) -> int:
        return len(self.index)


def parse_logprobs(batch: ForwardBatch, step: StepArrays, vocab_size: int) -> LogprobPlan | None:
    """The logprob positions of ``batch`` (None: none wanted), vectorised; raises
    ServiceError(invalid_request_error, 400) when they do not fit the batch."""
    if not batch.logprob_from:
        return None
    b = len(step.rows)
    start, count = _ints(batch.logprob_from, "logprob_from"), _ints(batch.logprob_count, "logprob_count")
    nxt, top = _ints(batch.logprob_next, "logprob_next"), _ints(batch.top_logprobs_num, "top_logprobs_num")
    _check(len(start) == b and len(count) == b and len(nxt) == b and len(top) == b,
           "logprob_from, logprob_count, logprob_next and top_logprobs_num must hold one entry per request")
    ext = step.extend_lens
    _check(bool(((count == 0) | ((start >= 0) & (count > 0) & (start + count <= ext))).all()),
           "logprob positions must lie inside each request's run")
    _check(bool(((top >= 0) & (top <= MAX_TOP_LOGPROBS)).all()),
           f"top_logprobs_num must be in [0, {MAX_TOP_LOGPROBS}]")
    _check(bool(((nxt >= -1) & (nxt < vocab_size)).all()), "logprob_next must be -1 or a token id")
    total = int(count.sum())
    owner = np.repeat(np.arange(b), count)
    offset = np.arange(total) - (np.cumsum(count) - count)[owner] + start[owner]  # within the run
    run_start = np.cumsum(ext) - ext
    index = run_start[owner] + offset
    is_last = offset + 1 == ext[owner]
    following = np.minimum(index + 1, len(step.input_ids) - 1)
    target = np.where(is_last, nxt[owner], step.input_ids[following])
    top_k = int(top[count > 0].max()) if total else 0
    return LogprobPlan(index, owner, target, top_k)


def parse_batch(batch: ForwardBatch, lim: Limits) -> StepArrays:
    """Check every index and length; raises ServiceError(invalid_request_error, 400)."""
    rows, prefix, extend = _ints(batch.rows, "rows"), _ints(batch.prefix_lens, "prefix_lens"), _ints(
        batch.extend_lens, "extend_lens"
    )
    ids, slots = _ints(batch.input_ids, "input_ids"), _ints(batch.out_slots, "out_slots")
    b = len(rows)
    _check(b > 0, "empty batch")
    _check(len(prefix) == b and len(extend) == b, "rows, prefix_lens and extend_lens differ in length")
    _check(_within(rows, lim.max_requests) and len(np.unique(rows)) == b, "rows out of range or repeated")
    _check(bool((prefix >= 0).all() and (extend >= 1).all()), "prefix_lens must be >= 0 and extend_lens >= 1")
    seq = prefix + extend
    _check(int(seq.max()) <= lim.max_model_len, f"sequence longer than max_model_len {lim.max_model_len}")
    t = int(extend.sum())
    _check(len(ids) == t and len(slots) == t, f"input_ids/out_slots must hold sum(extend_lens)={t} entries")
    _check(_within(ids + 1, lim.vocab_size + 1), f"token id out of range [0, {lim.vocab_size}) "
           "(or -1: the row's last sampled token)")
    _check(_within(slots, lim.kv_slots) and len(np.unique(slots)) == t, "out_slots out of range or repeated")
    _check_new_rows(batch.new_rows, lim.max_requests)
    _check_constrained_rows([r for r in batch.new_rows if r.regex], lim.vocab_size)
    check_extras(batch.new_rows, lim.vocab_size)
    shared = _prefix_slots(batch.new_rows, lim)
    if t == b:  # NOTE: decode-only step, the common case: one token per request
        token_rows, positions = rows, prefix
    else:
        owner = np.repeat(np.arange(b), extend)
        token_rows = rows[owner]
        positions = np.arange(t) - (np.cumsum(extend) - extend)[owner] + prefix[owner]
    future = np.flatnonzero(ids < 0)
    if len(future):
        _check_future(future, token_rows, positions, prefix, extend, batch.new_rows)
    return StepArrays(rows, prefix, extend, ids, slots, token_rows, positions, *shared, future)


def _check_future(future: np.ndarray, token_rows: np.ndarray, positions: np.ndarray,
                  prefix: np.ndarray, extend: np.ndarray, new_rows: list[NewRow]) -> None:
    """A -1 input id continues a running row: a one-token run after its prefix."""
    runs = np.searchsorted(np.cumsum(extend), future, side="right")
    _check(bool((extend[runs] == 1).all() and (positions[future] == prefix[runs]).all()
                and (prefix[runs] > 0).all()),
           "input id -1 (the last sampled token) only as the one token of a decode run")
    fresh = {r.row for r in new_rows}
    _check(not fresh.intersection(token_rows[future].tolist()),
           "input id -1 on a new row: it has sampled nothing yet")


def _prefix_slots(new_rows: list[NewRow], lim: Limits) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, position, slot) of the cached prefix each new row starts from."""
    lists = [r.prefix_slots for r in new_rows]
    lens = np.array([len(x) for x in lists], dtype=np.int64)
    if not lens.any():
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    slots = _ints([s for x in lists for s in x], "new_rows.prefix_slots")
    _check(_within(slots, lim.kv_slots), "new_rows.prefix_slots: slot out of range")
    _check(int(lens.max()) <= lim.max_model_len, "new_rows.prefix_slots: longer than max_model_len")
    owner = np.repeat(np.arange(len(new_rows)), lens)
    rows = np.array([r.row for r in new_rows], dtype=np.int64)[owner]
    positions = np.arange(len(slots)) - (np.cumsum(lens) - lens)[owner]
    return rows, positions, slots


def _check_new_rows(new_rows: list[NewRow], max_requests: int) -> None:
    if not new_rows:
        return
    rows = _ints([r.row for r in new_rows], "new_rows.row")
    _check(_within(rows, max_requests), "new_rows: row out of range")
    temp = np.array([r.temperature for r in new_rows], dtype=np.float64)
    top_p = np.array([r.top_p for r in new_rows], dtype=np.float64)
    _check(bool(np.isfinite(temp).all() and (temp >= 0).all()), "new_rows: temperature must be finite and >= 0")
    _check(bool(((top_p > 0) & (top_p <= 1)).all()), "new_rows: top_p must be in (0, 1]")
    _check(all(-(1 << 63) <= r.seed < (1 << 64) for r in new_rows), "new_rows: seed must fit 64 bits")
    _ints([r.top_k for r in new_rows], "new_rows.top_k")


def _check_constrained_rows(new_rows: list[NewRow], vocab_size: int) -> None:
    for r in new_rows:
        _check(bool(r.end_ids), "new_rows: a row with a regex needs end_ids (how it may end)")
        _check(_within(_ints(r.end_ids, "new_rows.end_ids"), vocab_size),
               f"new_rows.end_ids: token id out of range [0, {vocab_size})")
        _check(_within(_ints(r.regex_tokens, "new_rows.regex_tokens"), vocab_size),
               f"new_rows.regex_tokens: token id out of range [0, {vocab_size})")
        _check(r.regex_from >= 0, "new_rows.regex_from must be >= 0")


def _ints(values: list[int], name: str) -> np.ndarray:
    try:
        return np.asarray(values, dtype=np.int64).reshape(-1)
    except (OverflowError, ValueError, TypeError):
        raise invalid_request(f"{name}: not a list of 64-bit integers") from None


def _within(values: np.ndarray, bound: int) -> bool:
    return len(values) == 0 or (int(values.min()) >= 0 and int(values.max()) < bound)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise invalid_request(message)
