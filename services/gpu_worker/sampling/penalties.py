"""Logit edits before sampling: logit_bias, min_tokens and the penalties, batched.

Semantics (what vLLM does, so a request samples the same in either):

* ``logit_bias``: the bias is added to the token's logit (OpenAI);
* ``min_tokens``: EOS (unless ``ignore_eos``) and ``stop_token_ids`` are -inf
  while fewer than ``min_tokens`` output tokens are out;
* repetition (HF / vLLM): a token of prompt + output has its logit divided by
  the penalty when positive, multiplied when not;
* frequency / presence (OpenAI): ``logit -= frequency * count + presence * (count > 0)``
  over the output's tokens.

State per table row: the features it uses (host mirrors, so a batch without
them costs one numpy lookup) and, per feature, one [max_requests, vocab] device
table allocated on first use (output counts int32, the frequency / presence
offsets float32, bias float32, ids masked until min_tokens bool; the tokens a
repetition penalty covers: :mod:`.seen_tokens`, gathered and scattered only). A row's counts start from the ids its
``NewRow.extras`` brings (a retracted or moved request: its prompt and output so
far) and grow by the row's kept samples, one ``index_put_`` per step.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from libs.protocol.errors import invalid_request
from libs.protocol.messages import NewRow, SamplingExtras

from .seen_tokens import SeenTokens


class Penalties:
    def __init__(self, max_requests: int, vocab_size: int, eos_ids: list[int], device) -> None:
        self.shape = (max_requests, vocab_size)
        self.eos = np.asarray(sorted(set(eos_ids)), dtype=np.int64)
        self.device = torch.device(device)
        self.counted = np.zeros(max_requests, dtype=bool)  # a presence/frequency/repetition penalty
        self.repeats = np.zeros(max_requests, dtype=bool)  # a repetition penalty
        self.offsets = np.zeros(max_requests, dtype=bool)  # a presence or frequency penalty
        self.biased = np.zeros(max_requests, dtype=bool)
        self.min_until = np.zeros(max_requests, dtype=np.int64)  # end ids banned while seq_len < this
        self.sample_from = np.zeros(max_requests, dtype=np.int64)
        self.presence = torch.zeros(max_requests, device=self.device)
        self.frequency = torch.zeros(max_requests, device=self.device)
        self.repetition = torch.ones(max_requests, device=self.device)
        self._tables: dict[str, torch.Tensor] = {}
        self._seen: SeenTokens | None = None

    def table(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        """The [max_requests, vocab] table ``name``, allocated (zeros) on first use."""
        tab = self._tables.get(name)
        if tab is None:
            tab = self._tables[name] = torch.zeros(self.shape, dtype=dtype, device=self.device)
        return tab

    def set_rows(self, new_rows: list[NewRow]) -> None:
        """Reset every entering row; load the extras of those that have them."""
        if not new_rows:
            return
        rows = np.array([r.row for r in new_rows], dtype=np.int64)
        self.counted[rows] = self.repeats[rows] = self.offsets[rows] = self.biased[rows] = False
        self.min_until[rows] = 0
        extra = [(r.row, r.extras) for r in new_rows if r.extras is not None]
        if not extra:
            return
        rows = np.array([row for row, _ in extra], dtype=np.int64)
        exs = [ex for _, ex in extra]
        self._set_penalties(rows, exs)
        self._set_bias(rows, exs)
        self._set_min_tokens(rows, exs)

    def _set_penalties(self, rows: np.ndarray, exs: list[SamplingExtras]) -> None:
        on = np.array([_counted(ex) for ex in exs], dtype=bool)
        if not on.any():
            return
        rows, exs = rows[on], [ex for ex, o in zip(exs, on) if o]
        idx = torch.from_numpy(rows).to(self.device)
        self.presence[idx] = _floats([ex.presence_penalty for ex in exs], self.device)
        self.frequency[idx] = _floats([ex.frequency_penalty for ex in exs], self.device)
        self.repetition[idx] = _floats([ex.repetition_penalty for ex in exs], self.device)
        counts = self.table("counts", torch.int32)
        counts[idx] = 0
        out_r, out_t = self._flat(rows, [ex.output_ids for ex in exs])
        counts.index_put_((out_r, out_t), torch.ones_like(out_t, dtype=torch.int32), accumulate=True)
        offsets = np.array([bool(ex.presence_penalty or ex.frequency_penalty) for ex in exs])
        if offsets.any():  # NOTE: freq * count + presence * (count > 0), kept up to date per sample
            at = torch.from_numpy(rows[offsets]).to(self.device)
            c = counts[at].float()
            self.table("offset", torch.float32)[at] = (self.frequency[at][:, None] * c
                                                       + self.presence[at][:, None] * (c > 0))
        repeats = np.array([ex.repetition_penalty != 1.0 for ex in exs])
        if repeats.any():
            self._seen = self._seen or SeenTokens(*self.shape, self.device)
            self._seen.reset(rows[repeats], [ex.prompt_ids + ex.output_ids
                                             for ex, on in zip(exs, repeats) if on])
        self.sample_from[rows] = [ex.sample_from for ex in exs]
        self.counted[rows], self.offsets[rows], self.repeats[rows] = True, offsets, repeats

    def _set_bias(self, rows: np.ndarray, exs: list[SamplingExtras]) -> None:
        on = np.array([bool(ex.bias_ids) for ex in exs], dtype=bool)
        if not on.any():
            return
        rows, exs = rows[on], [ex for ex, o in zip(exs, on) if o]
        bias = self.table("bias", torch.float32)
        bias[torch.from_numpy(rows).to(self.device)] = 0.0
        r, t = self._flat(rows, [ex.bias_ids for ex in exs])
        bias[r, t] = _floats([v for ex in exs for v in ex.bias_values], self.device)
        self.biased[rows] = True

    def _set_min_tokens(self, rows: np.ndarray, exs: list[SamplingExtras]) -> None:
        on = np.array([ex.min_tokens > 0 for ex in exs], dtype=bool)
        if not on.any():
            return
        rows, exs = rows[on], [ex for ex, o in zip(exs, on) if o]
        ends = self.table("ends", torch.bool)
        ends[torch.from_numpy(rows).to(self.device)] = False
        r, t = self._flat(rows, [self._end_ids(ex) for ex in exs])
        ends[r, t] = True
        self.min_until[rows] = [ex.prompt_len + ex.min_tokens for ex in exs]

    def _end_ids(self, ex: SamplingExtras) -> list[int]:
        ids = set(ex.stop_token_ids) | (set() if ex.ignore_eos else set(self.eos.tolist()))
        return [i for i in ids if 0 <= i < self.shape[1]]  # NOTE: an id past the vocabulary never comes

    def _flat(self, rows: np.ndarray, lists: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """(row, token) index tensors of every token of ``lists[i]`` for ``rows[i]``."""
        lens = np.array([len(x) for x in lists], dtype=np.int64)
        tok = np.fromiter((t for x in lists for t in x), dtype=np.int64, count=int(lens.sum()))
        return (torch.from_numpy(np.repeat(rows, lens)).to(self.device),
                torch.from_numpy(tok).to(self.device))

    def apply(self, logits: torch.Tensor, rows: np.ndarray, seq_lens: np.ndarray) -> None:
        """Edit ``logits`` [B, vocab] in place for the batch's rows that use a feature."""
        which = np.flatnonzero(self.biased[rows])
        if len(which):
            _update(logits, which, lambda x, r: x + self._tables["bias"][r], rows, self.device)
        which = np.flatnonzero(seq_lens < self.min_until[rows])
        if len(which):
            _update(logits, which, lambda x, r: x.masked_fill(self._tables["ends"][r], -math.inf),
                    rows, self.device)
        which = np.flatnonzero(self.repeats[rows])  # NOTE: repetition first, as vLLM
        if len(which):
            _update(logits, which, lambda x, r: self._seen.penalise(x, r, self.repetition[r]),
                    rows, self.device)
        which = np.flatnonzero(self.offsets[rows])
        if len(which):
            _update(logits, which, lambda x, r: x - self._tables["offset"][r], rows, self.device)

    def update(self, rows: np.ndarray, seq_lens: np.ndarray, tokens: torch.Tensor) -> None:
        """Count each penalised row's sampled token, if that sample is kept."""
        which = np.flatnonzero(self.counted[rows] & (seq_lens >= self.sample_from[rows]))
        if not len(which):
            return
        r = torch.from_numpy(rows[which]).to(self.device)
        t = tokens[torch.from_numpy(which).to(tokens.device)].to(self.device)
        counts = self._tables["counts"]
        counts.index_put_((r, t), torch.ones_like(t, dtype=torch.int32), accumulate=True)
        off = self.offsets[rows[which]]
        if off.any():
            at = torch.from_numpy(np.flatnonzero(off)).to(self.device)
            ro, to = r[at], t[at]
            c = counts[ro, to].float()
            self._tables["offset"][ro, to] = self.frequency[ro] * c + self.presence[ro] * (c > 0)
        rep = self.repeats[rows[which]]
        if rep.any():
            at = torch.from_numpy(np.flatnonzero(rep)).to(self.device)
            self._seen.add(rows[which][rep], r[at], t[at])


def _counted(ex: SamplingExtras) -> bool:
    return bool(ex.presence_penalty or ex.frequency_penalty or ex.repetition_penalty != 1.0)


def _floats(values: list[float], device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, device=device)


def _update(logits: torch.Tensor, which: np.ndarray, fn, rows: np.ndarray, device) -> None:
    """logits[which] = fn(logits[which], rows[which]), in place for the whole batch."""
    r = torch.from_numpy(rows[which]).to(device)
    if len(which) == logits.shape[0]:
        logits.copy_(fn(logits, r))
        return
    at = torch.from_numpy(which).to(logits.device)
    logits[at] = fn(logits[at], r)


def check_extras(new_rows: list[NewRow], vocab_size: int) -> None:
    """400 unless every new row's extras are in range (the gateway checks them first)."""
    for r in new_rows:
        ex = r.extras
        if ex is None:
            continue
        values = [ex.presence_penalty, ex.frequency_penalty, ex.repetition_penalty, ex.min_p, *ex.bias_values]
        _check(all(math.isfinite(v) for v in values), "new_rows.extras: values must be finite")
        _check(ex.repetition_penalty > 0 and 0.0 <= ex.min_p <= 1.0, "new_rows.extras: repetition must be > 0, "
               "min_p in [0, 1]")
        _check(ex.min_tokens >= 0 and ex.prompt_len >= 0 and ex.sample_from >= 0,
               "new_rows.extras: min_tokens, prompt_len and sample_from must be >= 0")
        _check(len(ex.bias_ids) == len(ex.bias_values), "new_rows.extras: one bias value per bias id")
        _check(ex.repetition_penalty == 1.0 or bool(ex.prompt_ids or ex.output_ids),
               "new_rows.extras: a repetition penalty needs the prompt_ids it covers")
        ids = np.asarray([*ex.bias_ids, *ex.prompt_ids, *ex.output_ids], dtype=np.int64)
        _check(not len(ids) or (int(ids.min()) >= 0 and int(ids.max()) < vocab_size),
               f"new_rows.extras: token id out of range [0, {vocab_size})")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise invalid_request(message)
