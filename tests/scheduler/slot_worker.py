"""A worker stand-in for scheduler tests that reads tokens back through KV slots.

It stores each input token in the slot the scheduler assigned and "samples"
the next token as a hash of the sequence it reads back through the row's slot
table, so any slot the scheduler mixes up (reused while referenced, wrong
prefix slots) changes the output. It checks bookkeeping, not language.
Like the real worker it keeps each row's last sampled token: an input id -1
(a step sent ahead of the previous one's result) reads it.
"""

from __future__ import annotations

import numpy as np

from libs.protocol.messages import ForwardBatch, ForwardResult


class SlotWorker:
    def __init__(self, num_slots: int, max_requests: int, max_len: int, vocab: int = 97,
                 host_slots: int = 0, store: dict | None = None, page_tokens: int = 16) -> None:
        self.store = store  # the shared store (L3): key -> one page's values, as "put" leaves them
        self.page_tokens = page_tokens
        self.kv = np.full(num_slots, -1, dtype=np.int64)
        self.host = np.full(host_slots, -1, dtype=np.int64)  # the host pool: copies land here
        self.table = np.zeros((max_requests, max_len), dtype=np.int64)
        self.vocab = vocab
        self.last = np.full(max_requests, -1, dtype=np.int64)
        self.staging: dict[str, np.ndarray] = {}  # transfer buffers: what an import takes

    def run(self, batch: ForwardBatch) -> ForwardResult:
        for copy in batch.copies:  # NOTE: in order, before the forward, as the worker runs them
            if copy.kind == "put":
                n = self.page_tokens
                for i, key in enumerate(copy.keys):
                    self.store[key] = self.host[copy.src[i * n : (i + 1) * n]].copy()
                continue
            if copy.kind == "import":
                data = self.staging.pop(copy.buffer)
                assert len(data) == len(copy.dst) and (data >= 0).all()
                self.kv[copy.dst] = data
                continue
            assert copy.kind in ("d2h", "h2d") and len(copy.src) == len(copy.dst)
            src, dst = (self.kv, self.host) if copy.kind == "d2h" else (self.host, self.kv)
            assert (src[copy.src] >= 0).all(), f"{copy.kind} of slots nobody wrote"
            dst[copy.dst] = src[copy.src]
        for new in batch.new_rows:
            self.table[new.row, : len(new.prefix_slots)] = new.prefix_slots
            self.last[new.row] = -1
        out, logprobs, pos = [], [], 0
        for i, (row, prefix, n) in enumerate(zip(batch.rows, batch.prefix_lens, batch.extend_lens)):
            slots = np.asarray(batch.out_slots[pos : pos + n])
            ids = np.asarray(batch.input_ids[pos : pos + n])
            if (ids < 0).any():
                assert n == 1 and self.last[row] >= 0, "-1 on a row that sampled nothing"
                ids = self.last[row : row + 1]
            self.kv[slots] = ids
            self.table[row, prefix : prefix + n] = slots
            pos += n
            seq = self.kv[self.table[row, : prefix + n]]
            assert (seq >= 0).all(), "read a slot nobody wrote"
            out.append(hash(tuple(seq.tolist())) % self.vocab + 3)
            self.last[row] = out[-1]
            if batch.logprob_from and batch.logprob_count[i]:
                logprobs += self._logprobs(batch, i, seq, prefix, out[-1])
        return ForwardResult(step=batch.step, next_token_ids=out, forward_ms=0.0, logprobs=logprobs)

    @staticmethod
    def _logprobs(batch: ForwardBatch, i: int, seq: np.ndarray, prefix: int, sampled: int) -> list[float]:
        """A value per wanted position that depends on the sequence read so far and
        the target token, so a logprob reported for the wrong token shows."""
        start = batch.logprob_from[i]
        values = []
        for q in range(prefix + start, prefix + start + batch.logprob_count[i]):
            last = q + 1 == len(seq)
            target = (batch.logprob_next[i] if batch.logprob_next[i] >= 0 else sampled) \
                if last else int(seq[q + 1])
            values.append(-(hash((tuple(seq[: q + 1].tolist()), target)) % 1000) / 100)
        return values

    def fetch(self, keys: list[str], host_slots: list[int]) -> int:
        """FetchPages: the leading pages the store has, written into host slots."""
        n, arrived = self.page_tokens, 0
        for i, key in enumerate(keys):
            if key not in self.store:
                break
            self.host[host_slots[i * n : (i + 1) * n]] = self.store[key]
            arrived += 1
        return arrived
