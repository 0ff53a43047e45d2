"""Which tokens each row has seen (prompt + output), for the repetition penalty.

Kept twice: a [max_requests, vocab] bool table (is this token new to the row?) and,
per row, its distinct tokens in a padded id table [max_requests, cap] (padding repeats
the row's first id, so a duplicate column gets the same value), so applying the
penalty is one gather and one scatter over those columns, not a pass over the
vocabulary. ``cap`` doubles when a row could outgrow it (a host-side upper bound:
no device sync).
"""

from __future__ import annotations

import numpy as np
import torch

MIN_CAP = 64


class SeenTokens:
    def __init__(self, max_requests: int, vocab_size: int, device: torch.device) -> None:
        self.device = device
        self.seen = torch.zeros(max_requests, vocab_size, dtype=torch.bool, device=device)
        self.ids = torch.zeros(max_requests, MIN_CAP, dtype=torch.int64, device=device)
        self.count = torch.zeros(max_requests, dtype=torch.int64, device=device)
        self.upper = np.zeros(max_requests, dtype=np.int64)  # >= count, on the host

    def reset(self, rows: np.ndarray, tokens: list[list[int]]) -> None:
        """Rows start over with these tokens seen (each list non-empty)."""
        uniq = [np.unique(np.asarray(t, dtype=np.int64)) for t in tokens]
        lens = np.array([len(u) for u in uniq], dtype=np.int64)
        self._fit(int(lens.max()))
        table = np.repeat(np.array([u[0] for u in uniq], dtype=np.int64)[:, None], self.cap, axis=1)
        for i, u in enumerate(uniq):  # NOTE: at admission, not per step
            table[i, : len(u)] = u
        idx = torch.from_numpy(rows).to(self.device)
        self.ids[idx] = torch.from_numpy(table).to(self.device)
        self.count[idx] = torch.from_numpy(lens).to(self.device)
        self.upper[rows] = lens
        self.seen[idx] = False
        flat = torch.from_numpy(np.concatenate(uniq)).to(self.device)
        self.seen[torch.from_numpy(np.repeat(rows, lens)).to(self.device), flat] = True

    @property
    def cap(self) -> int:
        return self.ids.shape[1]

    def _fit(self, n: int) -> None:
        """Room for ``n`` ids per row (and one more)."""
        cap = self.cap
        while cap <= n:
            cap *= 2
        if cap != self.cap:
            pad = self.ids[:, :1].expand(-1, cap - self.cap)
            self.ids = torch.cat([self.ids, pad], dim=1)

    def add(self, rows: np.ndarray, r: torch.Tensor, tokens: torch.Tensor) -> None:
        """Rows ``r`` (``rows`` on the host) saw ``tokens``, one each."""
        self.upper[rows] += 1
        self._fit(int(self.upper[rows].max()))
        new = ~self.seen[r, tokens]
        pos = self.count[r]
        self.ids[r, pos] = torch.where(new, tokens, self.ids[r, pos])
        self.count[r] += new.long()
        self.seen[r, tokens] = True

    def penalise(self, x: torch.Tensor, r: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
        """HF / vLLM: a seen token's logit divided by the penalty when positive,
        multiplied when not; ``x`` [n, vocab] of rows ``r``, edited in place."""
        idx = self.ids[r]
        vals = x.gather(1, idx)
        rep = penalty[:, None]
        return x.scatter_(1, idx, torch.where(vals > 0, vals / rep, vals * rep))
