"""Synthetic steps over the paged layout, for tests and benchmarks.

A request owns ``ceil(seq_len / P)`` pages of ``P`` slots drawn at random from
the pool (slot = page * P + offset), so P = 1 scatters every token and P = 16
keeps runs of 16. The worker's slot table gets garbage past each length.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .base import AttentionMetadata


@dataclass(frozen=True)
class SyntheticStep:
    meta: AttentionMetadata
    owned: list[torch.Tensor]  # request i's slots for positions 0 .. seq_len - 1
    free: torch.Tensor  # slots nobody in the step owns (attention must never read them)

    @property
    def token_spans(self) -> list[slice]:
        ends = np.cumsum(self.meta.extend_lens)
        return [slice(int(e - n), int(e)) for e, n in zip(ends, self.meta.extend_lens)]


def synthetic_step(
    prefix_lens: list[int], extend_lens: list[int], *, num_slots: int, page_size: int = 1,
    max_requests: int | None = None, max_len: int | None = None,
    generator: torch.Generator | None = None, device: torch.device | str = "cpu",
) -> SyntheticStep:
    """A step where request i has ``prefix_lens[i]`` cached tokens and adds ``extend_lens[i]``."""
    gen = generator or torch.Generator().manual_seed(0)
    seq = [p + e for p, e in zip(prefix_lens, extend_lens)]
    batch = len(seq)
    max_requests = max_requests or batch
    max_len = max_len or max(seq)
    need = [-(-n // page_size) for n in seq]
    pages = torch.randperm(num_slots // page_size, generator=gen)
    if sum(need) > len(pages):
        raise ValueError(f"{sum(need)} pages of {page_size} needed, the pool has {len(pages)}")
    offsets = torch.arange(page_size)
    owned, used = [], 0
    for n, k in zip(seq, need):
        owned.append((pages[used : used + k, None] * page_size + offsets).reshape(-1)[:n])
        used += k
    unused = torch.ones(num_slots, dtype=torch.bool)
    unused[torch.cat(owned)] = False
    free = unused.nonzero().squeeze(1)  # NOTE: includes the tails of partly filled pages
    rows = torch.randperm(max_requests, generator=gen)[:batch]
    table = torch.randint(0, num_slots, (max_requests, max_len), generator=gen)
    for i in range(batch):
        table[rows[i], : seq[i]] = owned[i]
    out_slots = torch.cat([owned[i][prefix_lens[i] :] for i in range(batch)])
    meta = AttentionMetadata(
        rows=rows.to(device), prefix_lens=np.asarray(prefix_lens, dtype=np.int64),
        extend_lens=np.asarray(extend_lens, dtype=np.int64), out_slots=out_slots.to(device),
        slot_table=table.to(device),
    )
    return SyntheticStep(meta, [o.to(device) for o in owned], free.to(device))


def reference_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, prefix: int, scale: float
) -> torch.Tensor:
    """Causal GQA attention in float64: ``q`` [n, H, D] over ``keys``/``values`` [prefix + n, Hkv, D]."""
    n, heads = q.shape[:2]
    group = heads // keys.shape[1]
    k = keys.double().repeat_interleave(group, dim=1)
    v = values.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    pos_q = prefix + torch.arange(n, device=q.device)
    allowed = torch.arange(keys.shape[0], device=q.device)[None, :] <= pos_q[:, None]
    scores = scores.masked_fill(~allowed[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
