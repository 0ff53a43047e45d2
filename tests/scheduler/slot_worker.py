"""A worker stand-in for scheduler tests that reads tokens back through KV slots.

It stores each input token in the slot the scheduler assigned and "samples"
the next token as a hash of the sequence it reads back through the row's slot
table, so any slot the scheduler mixes up (reused while referenced, wrong
prefix slots) changes the output. It checks bookkeeping, not language.
"""

from __future__ import annotations

import numpy as np

from libs.protocol.messages import ForwardBatch, ForwardResult


class SlotWorker:
    def __init__(self, num_slots: int, max_requests: int, max_len: int, vocab: int = 97) -> None:
        self.kv = np.full(num_slots, -1, dtype=np.int64)
        self.table = np.zeros((max_requests, max_len), dtype=np.int64)
        self.vocab = vocab

    def run(self, batch: ForwardBatch) -> ForwardResult:
        for new in batch.new_rows:
            self.table[new.row, : len(new.prefix_slots)] = new.prefix_slots
        out, pos = [], 0
        for row, prefix, n in zip(batch.rows, batch.prefix_lens, batch.extend_lens):
            slots = np.asarray(batch.out_slots[pos : pos + n])
            self.kv[slots] = batch.input_ids[pos : pos + n]
            self.table[row, prefix : prefix + n] = slots
            pos += n
            seq = self.kv[self.table[row, : prefix + n]]
            assert (seq >= 0).all(), "read a slot nobody wrote"
            out.append(hash(tuple(seq.tolist())) % self.vocab + 3)
        return ForwardResult(step=batch.step, next_token_ids=out, forward_ms=0.0)
