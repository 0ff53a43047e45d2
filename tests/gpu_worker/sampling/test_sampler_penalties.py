"""Penalties, logit_bias, min_tokens and min_p against HF transformers' logits processors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (
    MinNewTokensLengthLogitsProcessor, MinPLogitsWarper, RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
)

from libs.protocol.errors import ServiceError
from libs.protocol.extras import row_extras
from libs.protocol.messages import NewRow, SamplingParams
from services.gpu_worker.sampling.penalties import Penalties, check_extras
from services.gpu_worker.sampling.sampler import Sampler, _min_p

V, R = 300, 8
EOS = [2]
FREE = dict(temperature=1.0, top_p=1.0, top_k=-1, seed=0)


def _row(row: int, prompt: list[int], output: list[int] = (), **params) -> NewRow:
    s = SamplingParams(max_new_tokens=64, **params)
    return NewRow(row=row, **FREE, extras=row_extras(s, list(prompt), list(output)))


def _apply(p: Penalties, logits: torch.Tensor, rows: list[int], seq_lens: list[int]) -> torch.Tensor:
    out = logits.clone()
    p.apply(out, np.array(rows), np.array(seq_lens))
    return out


def _ids(gen: torch.Generator, n: int) -> list[int]:
    return torch.randint(0, V, (n,), generator=gen).tolist()


def test_repetition_penalty_matches_hf_over_prompt_and_output():
    gen = torch.Generator().manual_seed(0)
    p = Penalties(R, V, EOS, "cpu")
    seqs = {3: (_ids(gen, 40), _ids(gen, 10), 1.3), 5: (_ids(gen, 7), [], 0.7), 1: (_ids(gen, 90), _ids(gen, 30), 2.0)}
    p.set_rows([_row(r, pr, out, repetition_penalty=pen) for r, (pr, out, pen) in seqs.items()])
    logits = torch.randn(3, V, generator=gen) * 4
    rows = list(seqs)
    got = _apply(p, logits, rows, [len(pr) + len(out) for pr, out, _ in seqs.values()])
    for i, (pr, out, pen) in enumerate(seqs.values()):
        want = RepetitionPenaltyLogitsProcessor(pen)(torch.tensor([pr + out]), logits[i:i + 1].clone())
        torch.testing.assert_close(got[i], want[0])


def test_frequency_and_presence_follow_openai_over_the_output_only():
    gen = torch.Generator().manual_seed(1)
    p = Penalties(R, V, EOS, "cpu")
    prompt, out = _ids(gen, 20), [5, 5, 5, 9, 9, 11]
    p.set_rows([_row(2, prompt, out, frequency_penalty=0.5, presence_penalty=-1.25)])
    logits = torch.randn(1, V, generator=gen)
    got = _apply(p, logits, [2], [len(prompt) + len(out)])
    want = logits[0].clone()
    for tok in set(out):  # mu[j] - c[j] * alpha_frequency - (c[j] > 0) * alpha_presence
        want[tok] -= out.count(tok) * 0.5 + 1 * -1.25
    torch.testing.assert_close(got[0], want)


def test_logit_bias_matches_hf_sequence_bias_of_single_tokens():
    gen = torch.Generator().manual_seed(2)
    bias = {7: 100.0, 8: -100.0, 299: 3.5, 0: -0.25}
    p = Penalties(R, V, EOS, "cpu")
    p.set_rows([_row(4, [1, 2, 3], logit_bias=bias)])
    logits = torch.randn(2, V, generator=gen)
    got = _apply(p, logits, [4, 6], [3, 9])  # row 6 has none: untouched
    hf = SequenceBiasLogitsProcessor([[[t], b] for t, b in bias.items()])
    torch.testing.assert_close(got[0], hf(torch.tensor([[1, 2, 3]]), logits[:1].clone())[0])
    assert torch.equal(got[1], logits[1])


def test_min_tokens_matches_hf_and_masks_stop_token_ids():
    gen = torch.Generator().manual_seed(3)
    prompt = _ids(gen, 12)
    p = Penalties(R, V, EOS, "cpu")
    p.set_rows([_row(0, prompt, min_tokens=3, stop_token_ids=[17]),
                _row(1, prompt, min_tokens=3, ignore_eos=True, stop_token_ids=[17])])
    logits = torch.randn(2, V, generator=gen)
    hf = MinNewTokensLengthLogitsProcessor(len(prompt), 3, EOS + [17])
    for out in range(5):  # output tokens already out
        n = len(prompt) + out
        got = _apply(p, logits, [0, 1], [n, n])
        want = hf(torch.zeros(1, n, dtype=torch.long), logits[:1].clone())[0]
        torch.testing.assert_close(got[0], want)
        assert math.isinf(got[1, 17]) == (out < 3) and got[1, 2] == logits[1, 2]  # EOS ignored


def test_min_p_matches_hf_after_temperature():
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(5, V, generator=gen) * 3
    min_p = torch.tensor([0.0, 0.05, 0.2, 0.5, 1.0])
    for temp in (0.5, 1.0, 1.7):
        got = _min_p(logits / temp, torch.log(min_p))
        for i, mp in enumerate(min_p.tolist()):
            want = logits[i:i + 1] / temp
            if mp:
                want = MinPLogitsWarper(mp)(None, want.clone())
            assert torch.equal(torch.isinf(got[i]), torch.isinf(want[0])), (temp, mp)


def test_min_p_rows_sample_only_kept_tokens_and_others_are_unchanged():
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(2, V, generator=gen) * 2
    s, plain = Sampler(R, V), Sampler(R, V)
    s.set_rows([_row(0, [1], min_p=0.3), NewRow(row=1, **{**FREE, "seed": 9})])
    plain.set_rows([NewRow(row=1, **{**FREE, "seed": 9})])
    kept = torch.softmax(logits[0], -1) >= 0.3 * torch.softmax(logits[0], -1).max()
    for pos in range(200):
        tok = s.sample(logits.clone(), np.array([0, 1]), torch.tensor([pos, pos]))
        assert kept[tok[0]]
        assert tok[1] == plain.sample(logits[1:].clone(), np.array([1]), torch.tensor([pos]))[0]


def test_counts_of_a_resumed_row_equal_those_grown_step_by_step():
    gen = torch.Generator().manual_seed(6)
    prompt, out = _ids(gen, 30), _ids(gen, 12)
    params = dict(repetition_penalty=1.5, frequency_penalty=0.4, presence_penalty=0.3)
    grown, resumed = Penalties(R, V, EOS, "cpu"), Penalties(R, V, EOS, "cpu")
    grown.set_rows([_row(1, prompt, **params)])
    # a two-chunk prefill: the first chunk's sample is thrown away, then one token per step
    grown.update(np.array([1]), np.array([10]), torch.tensor([out[0] ^ 1]))
    for i, tok in enumerate(out):
        grown.update(np.array([1]), np.array([len(prompt) + i]), torch.tensor([tok]))
    resumed.set_rows([_row(6, prompt, out, **params)])
    logits = torch.randn(1, V, generator=gen)
    n = len(prompt) + len(out)
    torch.testing.assert_close(_apply(grown, logits, [1], [n]), _apply(resumed, logits, [6], [n]))
    hf = RepetitionPenaltyLogitsProcessor(1.5)(torch.tensor([prompt + out]), logits.clone())
    counts = torch.bincount(torch.tensor(out), minlength=V).float()
    torch.testing.assert_close(_apply(resumed, logits, [6], [n])[0], hf[0] - 0.4 * counts - 0.3 * (counts > 0))


def test_a_row_entering_without_extras_forgets_the_previous_ones():
    p = Penalties(R, V, EOS, "cpu")
    p.set_rows([_row(3, [4, 5], logit_bias={4: 50.0}, min_tokens=2, repetition_penalty=1.9)])
    p.set_rows([NewRow(row=3, **FREE)])
    logits = torch.randn(1, V)
    assert torch.equal(_apply(p, logits, [3], [2]), logits)
    assert not p.counted[3] and not p.biased[3] and p.min_until[3] == 0


def test_no_extras_allocates_nothing():
    p = Penalties(R, V, EOS, "cpu")
    p.set_rows([NewRow(row=r, **FREE) for r in range(R)])
    logits = torch.randn(R, V)
    assert torch.equal(_apply(p, logits, list(range(R)), [5] * R), logits)
    p.update(np.arange(R), np.full(R, 5), logits.argmax(-1))
    assert p._tables == {}


@pytest.mark.parametrize("extras, message", [
    (dict(bias_ids=[V], bias_values=[1.0]), "token id out of range"),
    (dict(bias_ids=[1], bias_values=[]), "one bias value per bias id"),
    (dict(repetition_penalty=0.0), "repetition must be > 0"),
    (dict(min_p=1.5), "min_p in [0, 1]"),
    (dict(presence_penalty=math.nan), "finite"),
    (dict(min_tokens=-1), ">= 0"),
    (dict(repetition_penalty=1.5), "needs the prompt_ids"),
])
def test_bad_extras_are_refused(extras, message):
    from libs.protocol.messages import SamplingExtras

    with pytest.raises(ServiceError, match=message.replace("[", r"\[").replace("]", r"\]")):
        check_extras([NewRow(row=0, **FREE, extras=SamplingExtras(**extras))], V)


def test_the_seen_tokens_outgrow_their_table():
    gen = torch.Generator().manual_seed(7)
    prompt = torch.randperm(V, generator=gen)[:60].tolist()  # 60 distinct: the 64-column table
    out = torch.randperm(V, generator=gen)[:50].tolist()  # some of them new: it grows
    p = Penalties(R, V, EOS, "cpu")
    p.set_rows([_row(2, prompt, repetition_penalty=1.7), _row(3, prompt[:5], repetition_penalty=0.5)])
    for i, tok in enumerate(out):
        p.update(np.array([2, 3]), np.array([60 + i, 5 + i]), torch.tensor([tok, tok]))
    assert p._seen.cap > 64
    logits = torch.randn(2, V, generator=gen) * 3
    got = _apply(p, logits, [2, 3], [110, 55])
    for i, (ids, pen) in enumerate(((prompt + out, 1.7), (prompt[:5] + out, 0.5))):
        want = RepetitionPenaltyLogitsProcessor(pen)(torch.tensor([ids]), logits[i:i + 1].clone())
        torch.testing.assert_close(got[i], want[0])
