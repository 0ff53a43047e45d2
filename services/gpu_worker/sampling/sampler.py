"""Vectorised, seeded sampling of the next token of every request in a batch.

Each table row keeps its sampling parameters in preallocated tensors. The
uniform number behind the token at position ``p`` is ``splitmix64(seed, p)``,
so a request samples the same tokens whatever batch it runs in.

Paths, chosen per row from its own parameters only (so the choice never
depends on the rest of the batch):

* greedy: temperature < 1e-5 or top_k == 1 -> argmax;
* full:   no top_k and top_p == 1 -> inverse CDF over the whole vocabulary;
* nucleus: otherwise -> inverse CDF over the ``CANDIDATES`` most likely tokens,
  sorted; rows whose top_k / top_p reach beyond them fall back to a full sort.

``min_p`` (vLLM's order) drops unlikely tokens after temperature, before top_k /
top_p; penalties, logit_bias and min_tokens edit the logits before this
(:mod:`.penalties`).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from libs.protocol.messages import NewRow

GREEDY_EPS = 1e-5
CANDIDATES = 128
GREEDY, FULL, NUCLEUS = 0, 1, 2

_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's ``>>`` is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def seeded_uniform(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Uniform float64 in [0, 1): splitmix64's ``(p+1)``-th output for state ``seed`` (int64 wraps)."""
    z = seeds + (positions + 1) * _GOLDEN
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    z = z ^ _shr(z, 31)
    return _shr(z, 11).double() * (2.0**-53)


def to_int64(seed: int) -> int:
    """A 64-bit seed (signed or unsigned) as a signed int64."""
    return seed - (1 << 64) if seed >= (1 << 63) else seed


class Sampler:
    """Per-row sampling state ([max_requests] tensors) and the batched ``sample``."""

    def __init__(self, max_requests: int, vocab_size: int, device="cpu") -> None:
        self.vocab_size = vocab_size
        self.temperature = torch.ones(max_requests, device=device)
        self.top_p = torch.ones(max_requests, device=device)
        self.top_k = torch.full((max_requests,), -1, dtype=torch.int64, device=device)
        self.seed = torch.zeros(max_requests, dtype=torch.int64, device=device)
        self.log_min_p = torch.full((max_requests,), -math.inf, device=device)  # log(min_p)
        self.has_min_p = np.zeros(max_requests, dtype=bool)
        self.mode = np.zeros(max_requests, dtype=np.int8)  # host mirror: GREEDY / FULL / NUCLEUS

    def set_rows(self, new_rows: list[NewRow]) -> None:
        """Store the parameters of requests entering rows (validated by the caller)."""
        if not new_rows:
            return
        rows = np.array([r.row for r in new_rows], dtype=np.int64)
        temp = np.array([r.temperature for r in new_rows], dtype=np.float32)
        top_p = np.array([r.top_p for r in new_rows], dtype=np.float32)
        top_k = np.array([r.top_k for r in new_rows], dtype=np.int64)
        top_k = np.where((top_k <= 0) | (top_k >= self.vocab_size), -1, top_k)
        seeds = np.array([to_int64(r.seed) for r in new_rows], dtype=np.int64)
        mode = np.where(top_p >= 1.0, np.where(top_k == -1, FULL, NUCLEUS), NUCLEUS)
        mode = np.where((temp < GREEDY_EPS) | (top_k == 1), GREEDY, mode)
        idx = torch.from_numpy(rows).to(self.seed.device)
        self.temperature[idx] = torch.from_numpy(temp).to(self.temperature.device)
        self.top_p[idx] = torch.from_numpy(top_p).to(self.top_p.device)
        self.top_k[idx] = torch.from_numpy(top_k).to(self.top_k.device)
        self.seed[idx] = torch.from_numpy(seeds).to(self.seed.device)
        self.mode[rows] = mode.astype(np.int8)
        min_p = np.array([r.extras.min_p if r.extras is not None else 0.0 for r in new_rows])
        self.has_min_p[rows] = min_p > 0
        with np.errstate(divide="ignore"):
            self.log_min_p[idx] = torch.from_numpy(np.log(min_p).astype(np.float32)).to(idx.device)

    def sample(self, logits: torch.Tensor, rows: np.ndarray, positions: torch.Tensor) -> torch.Tensor:
        """Next token ([B] int64) for logits [B, vocab] of requests in ``rows`` (host).

        ``positions`` ([B] int64) is where each sampled token will sit.
        """
        out = greedy(logits)
        mode = self.mode[rows]
        for kind, fn in ((FULL, self._full), (NUCLEUS, self._nucleus)):
            which = np.flatnonzero(mode == kind)
            if len(which):
                idx = torch.from_numpy(which).to(logits.device)
                r = torch.from_numpy(rows[which]).to(logits.device)
                scaled = logits[idx] / self.temperature[r][:, None]
                if self.has_min_p[rows[which]].any():
                    scaled = _min_p(scaled, self.log_min_p[r])
                probs = torch.softmax(scaled, dim=-1)
                u = seeded_uniform(self.seed[r], positions[idx])
                out[idx] = fn(probs, r, u)
        return out

    def _full(self, probs: torch.Tensor, r: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        return _inverse_cdf(probs, None, self.top_k[r], self.top_p[r], u)

    def _nucleus(self, probs: torch.Tensor, r: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        top_k, top_p = self.top_k[r], self.top_p[r]
        vals, cand = probs.topk(min(CANDIDATES, probs.shape[-1]), dim=-1)
        out = _inverse_cdf(vals, cand, top_k, top_p, u)
        k = vals.shape[-1]
        covered = (top_k > 0) & (top_k <= k) | (top_k <= 0) & (vals.sum(-1) >= top_p)
        if not bool(covered.all()):
            wide = torch.nonzero(~covered).squeeze(1)
            vals, cand = probs[wide].sort(dim=-1, descending=True)
            out[wide] = _inverse_cdf(vals, cand, top_k[wide], top_p[wide], u[wide])
        return out


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """argmax over the last dim (the first of equal maxima, NaN counting as the largest,
    as torch.argmax). NOTE: on the CPU numpy's argmax is ~10x torch's at [32, 49152]
    (3 vs 30 ms on one thread, side by side): it is vectorised, torch's reduction is not."""
    if logits.device.type != "cpu":
        return logits.argmax(dim=-1)
    values = logits.detach()
    if values.dtype != torch.float32:
        values = values.float()  # NOTE: exact for bf16 / fp16: the same argmax
    return torch.from_numpy(np.argmax(values.numpy(), axis=-1))


def _min_p(scaled: torch.Tensor, log_min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose probability is below ``min_p`` times the likeliest one's
    (on temperature-scaled logits: l < l_max + log(min_p)); log(0) = -inf keeps all."""
    top = scaled.max(dim=-1, keepdim=True).values
    return scaled.masked_fill(scaled < top + log_min_p[:, None], -math.inf)


def _inverse_cdf(vals, cand, top_k, top_p, u) -> torch.Tensor:
    """Pick from probabilities ``vals`` [n, K] (sorted when filtering) with uniforms ``u``.

    ``cand`` maps columns to token ids (None: columns are token ids). top_k
    renormalises before top_p, as HF does; the first candidate is always kept.
    """
    k = vals.shape[-1]
    col = torch.arange(k, device=vals.device)
    limited = top_k > 0
    vals = vals.double().masked_fill(limited[:, None] & (col >= top_k[:, None]), 0.0)
    norm = torch.where(limited, vals.sum(-1), torch.ones_like(vals[:, 0]))
    vals = vals / norm[:, None]
    cum = vals.cumsum(-1)
    drop = ((cum - vals) > top_p[:, None]) & (top_p[:, None] < 1.0)
    cdf = vals.masked_fill(drop, 0.0).cumsum(-1)
    pick = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).clamp_(max=k - 1)
    return pick.squeeze(1) if cand is None else cand.gather(1, pick).squeeze(1)


LOGPROB_CHUNK = 256  # rows of log_softmax at a time: bounds the [rows, vocab] temporaries


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, top_k: int
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """log p(targets[i]) under softmax(logits[i]) (float32, no temperature), and the
    ``top_k`` likeliest tokens of each row: ([M], [M, top_k] ids, [M, top_k] logprobs)."""
    m = logits.shape[0]
    out = torch.empty(m, dtype=torch.float32, device=logits.device)
    top_ids = torch.empty(m, top_k, dtype=torch.int64, device=logits.device)
    top_lp = torch.empty(m, top_k, dtype=torch.float32, device=logits.device)
    for lo in range(0, m, LOGPROB_CHUNK):
        hi = min(m, lo + LOGPROB_CHUNK)
        lp = torch.log_softmax(logits[lo:hi].float(), dim=-1)
        out[lo:hi] = lp.gather(1, targets[lo:hi, None]).squeeze(1)
        if top_k:
            top_lp[lo:hi], top_ids[lo:hi] = lp.topk(top_k, dim=-1)
    return out, top_ids, top_lp
