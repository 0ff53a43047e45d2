"""Seeded, vectorised sampling."""

from __future__ import annotations

import numpy as np
import torch

from libs.protocol.messages import NewRow
from services.gpu_worker.sampling.sampler import Sampler, seeded_uniform, to_int64

V = 1000


def _splitmix64(seed: int, n: int) -> float:
    """Pure-python splitmix64: the n-th output (n >= 1) for state ``seed``, as a float in [0, 1)."""
    m = (1 << 64) - 1
    z = (seed + n * 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    z ^= z >> 31
    return (z >> 11) * 2.0**-53


def test_seeded_uniform_matches_splitmix64():
    seeds = [0, 1, 42, (1 << 64) - 1, 1 << 63, 123456789123456789]
    positions = [0, 7, 100, 5000, 1, 8191]
    got = seeded_uniform(
        torch.tensor([to_int64(s) for s in seeds]), torch.tensor(positions)
    ).tolist()
    assert got == [_splitmix64(s, p + 1) for s, p in zip(seeds, positions)]


def test_seeded_uniform_is_uniform():
    u = seeded_uniform(torch.full((20000,), 7), torch.arange(20000))
    assert float(u.min()) >= 0 and float(u.max()) < 1
    hist = torch.histc(u.float(), bins=10, min=0, max=1)
    assert float(hist.min()) > 1800 and float(hist.max()) < 2200


def _sampler(params: dict[int, tuple[float, float, int, int]]) -> Sampler:
    s = Sampler(max_requests=16, vocab_size=V)
    s.set_rows([NewRow(row=r, temperature=t, top_p=p, top_k=k, seed=seed) for r, (t, p, k, seed) in params.items()])
    return s


def test_greedy_and_top_k_one_are_argmax():
    logits = torch.randn(4, V)
    s = _sampler({0: (0.0, 1.0, -1, 1), 1: (1e-6, 0.5, 10, 2), 2: (1.5, 1.0, 1, 3), 3: (0.7, 0.9, 1, 4)})
    got = s.sample(logits, np.array([0, 1, 2, 3]), torch.tensor([5, 5, 5, 5]))
    assert torch.equal(got, logits.argmax(-1))


def test_same_tokens_whatever_the_batch():
    gen = torch.Generator().manual_seed(0)
    logits = {r: torch.randn(V, generator=gen) * 2 for r in range(6)}
    logits[5] = torch.zeros(V)  # flat: top_p 0.95 needs more than the candidate set
    params = {
        0: (1.0, 1.0, -1, 11),  # full vocabulary
        1: (0.8, 0.9, -1, 12),  # nucleus
        2: (1.2, 1.0, 50, 13),  # top_k
        3: (0.0, 1.0, -1, 14),  # greedy
        4: (1.0, 0.95, 400, 15),  # top_k beyond the candidates: full sort
        5: (1.0, 0.95, -1, 16),  # top_p beyond the candidates: full sort
    }
    s = _sampler(params)
    pos = {r: 10 + r for r in range(6)}

    def run(rows):
        out = s.sample(torch.stack([logits[r] for r in rows]), np.array(rows), torch.tensor([pos[r] for r in rows]))
        return dict(zip(rows, out.tolist()))

    alone = {r: run([r])[r] for r in range(6)}
    assert run([0, 1, 2, 3, 4, 5]) == alone
    assert run([5, 3, 1, 4, 0, 2]) == alone
    assert run([2, 4]) == {2: alone[2], 4: alone[4]}
    # another position draws another number: over 20 positions a sampled row varies
    draws = {s.sample(logits[0][None], np.array([0]), torch.tensor([p])).item() for p in range(20)}
    assert len(draws) > 5


def _draws(s: Sampler, logits: torch.Tensor, n: int = 4000) -> torch.Tensor:
    return s.sample(logits.expand(n, -1).contiguous(), np.zeros(n, dtype=np.int64), torch.arange(n))


def test_distribution_follows_probabilities():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = torch.full((V,), -1e4)
    logits[:4] = probs.log()
    counts = torch.bincount(_draws(_sampler({0: (1.0, 1.0, -1, 3)}), logits), minlength=V).float() / 4000
    torch.testing.assert_close(counts[:4], probs, atol=0.03, rtol=0)
    assert float(counts[4:].sum()) == 0


def test_top_p_and_top_k_restrict_support():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = torch.full((V,), -1e4)
    logits[:4] = probs.log()
    nucleus = torch.bincount(_draws(_sampler({0: (1.0, 0.7, -1, 5)}), logits), minlength=V).float() / 4000
    assert float(nucleus[2:].sum()) == 0  # 0.5 + 0.3 >= 0.7: only two tokens
    assert abs(float(nucleus[0]) - 0.625) < 0.03  # renormalised 0.5 / 0.8
    top3 = torch.bincount(_draws(_sampler({0: (1.0, 1.0, 3, 6)}), logits), minlength=V).float() / 4000
    assert float(top3[3:].sum()) == 0 and float(top3[2]) > 0.1
    # temperature sharpens: at 0.3 the top token dominates
    sharp = torch.bincount(_draws(_sampler({0: (0.3, 1.0, -1, 7)}), logits), minlength=V).float() / 4000
    assert float(sharp[0]) > 0.8
