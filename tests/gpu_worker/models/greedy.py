"""Greedy generation through a ModelRunner the way the scheduler drives it (a concurrent batch,
prefill chunks mixed with decode tokens, rows starting from cached slots), and HF's reference."""

from __future__ import annotations

import torch

from libs.protocol.messages import ForwardBatch, NewRow

GREEDY = dict(temperature=0.0, top_p=1.0, top_k=-1, seed=0)


class Slots:
    """Fresh slot numbers in a scrambled order."""

    def __init__(self, total: int) -> None:
        self._free = torch.randperm(total, generator=torch.Generator().manual_seed(0)).tolist()

    def take(self, n: int) -> list[int]:
        out, self._free = self._free[:n], self._free[n:]
        return out


def generate(runner, prompts: list[list[int]], n: int, slots: Slots, chunk: int = 1 << 20,
             cached: list[list[int]] | None = None) -> tuple[list[list[int]], list[list[int]]]:
    """``n`` greedy tokens for every prompt, all in one batch from the first step (row r: prompt r),
    each prompt fed ``chunk`` tokens a step; ``cached[r]``: slots already holding the KV of prompt
    r's first tokens. Returns the outputs and every row's slots."""
    cached = cached or [[] for _ in prompts]
    held = [list(c) for c in cached]  # slots of each row, in position order
    fed = [len(c) for c in cached]
    outs: list[list[int]] = [[] for _ in prompts]
    new = {r: NewRow(row=r, prefix_slots=list(c), **GREEDY) for r, c in enumerate(cached)}
    step = 0
    while active := [r for r in range(len(prompts)) if len(outs[r]) < n]:
        feeds = [prompts[r][fed[r]: fed[r] + chunk] if fed[r] < len(prompts[r]) else outs[r][-1:] for r in active]
        out_slots = slots.take(sum(map(len, feeds)))
        batch = ForwardBatch(step=step, new_rows=[new.pop(r) for r in active if r in new], rows=active,
                             prefix_lens=[len(held[r]) for r in active], extend_lens=list(map(len, feeds)),
                             input_ids=[t for f in feeds for t in f], out_slots=out_slots)
        start = 0
        for r, f, token in zip(active, feeds, runner.execute(batch)):
            held[r] += out_slots[start: start + len(f)]
            start += len(f)
            fed[r] += len(f)
            if fed[r] >= len(prompts[r]):  # NOTE: a chunk short of the prompt's end samples nothing kept
                outs[r].append(token)
        step += 1
    return outs, held


def hf_greedy(hf_model, ids: list[int], n: int) -> tuple[list[int], float]:
    """HF's greedy tokens and the smallest gap between the top two logits along the way, relative to
    the largest logit (fp32 logits agree to ~1e-6 of it: a gap well above that is no near-tie)."""
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                do_sample=False, max_new_tokens=n, pad_token_id=2, output_scores=True,
                                return_dict_in_generate=True)
    gaps = [float(s[0].topk(2).values.diff().abs() / s[0].abs().max()) for s in out.scores]
    return out.sequences[0, len(ids):].tolist(), min(gaps)
