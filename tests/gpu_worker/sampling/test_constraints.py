"""Regex-constrained rows on a small hand-made vocabulary (no model)."""

from __future__ import annotations

import numpy as np
import torch

from libs.protocol.messages import NewRow
from services.gpu_worker.sampling.constraints import Constraints

# id:      0    1    2     3    4    5     6     7    8
TEXTS = ["a", "b", "ab", "1", "2", "12", None, " ", "ba"]
EOS = 6
GREEDY = dict(temperature=0.0, top_p=1.0, top_k=-1, seed=0)


def _constraints(max_requests: int = 4) -> Constraints:
    return Constraints(max_requests, len(TEXTS), lambda: TEXTS, torch.device("cpu"))


def _row(row: int, regex: str, start: int = 5, replay=(), end=(EOS,)) -> NewRow:
    return NewRow(row=row, **GREEDY, regex=regex, regex_from=start, regex_tokens=list(replay),
                  end_ids=list(end))


def _allowed(c: Constraints, rows, which=None) -> list[list[int]]:
    rows = np.asarray(rows)
    which = c.constrained(rows) if which is None else which
    logits = torch.zeros(len(rows), len(TEXTS))
    c.mask(logits, rows, which)
    return [torch.isfinite(x).nonzero().flatten().tolist() for x in logits]


def _feed(c: Constraints, rows, seq_lens, tokens) -> None:
    rows = np.asarray(rows)
    c.advance(rows, c.constrained(rows), np.asarray(seq_lens), torch.tensor(tokens))


def test_mask_follows_the_pattern_and_allows_the_end_only_on_a_match():
    c = _constraints()
    c.set_rows([_row(1, "a+b")])
    everything = list(range(len(TEXTS)))
    assert _allowed(c, [0, 1]) == [everything, [0, 2]]  # row 0 is free
    _feed(c, [0, 1], [3, 5], [3, 0])  # row 1 sampled "a"
    assert _allowed(c, [0, 1])[1] == [0, 1, 2]
    _feed(c, [0, 1], [4, 6], [3, 1])  # "ab": a full match with nothing after it
    assert _allowed(c, [1]) == [[EOS]]


def test_an_accepting_state_with_a_continuation_may_end_or_go_on():
    c = _constraints()
    c.set_rows([_row(2, "[12]+")])
    assert _allowed(c, [2]) == [[3, 4, 5]]
    _feed(c, [2], [5], [5])
    assert _allowed(c, [2]) == [[3, 4, 5, EOS]]


def test_samples_before_the_output_starts_do_not_advance():
    c = _constraints()
    c.set_rows([_row(0, "a+b", start=8)])
    _feed(c, [0], [4], [0])  # an earlier prefill chunk: its sample is thrown away
    assert _allowed(c, [0]) == [[0, 2]]
    _feed(c, [0], [8], [0])  # the last chunk: this sample is the first output token
    assert _allowed(c, [0]) == [[0, 1, 2]]


def test_a_resumed_row_replays_its_output_and_a_new_row_clears_it():
    c = _constraints()
    c.set_rows([_row(3, "a+b", replay=[0, 0])])
    assert _allowed(c, [3]) == [[0, 1, 2]]
    c.set_rows([NewRow(row=3, **GREEDY)])
    assert _allowed(c, [3]) == [list(range(len(TEXTS)))]
    assert len(c.constrained(np.array([3]))) == 0


def test_rows_with_different_patterns_in_one_batch():
    c = _constraints()
    c.set_rows([_row(0, "a+b"), _row(1, "[12]+"), _row(2, "a+b")])
    assert _allowed(c, [2, 3, 1, 0]) == [[0, 2], list(range(len(TEXTS))), [3, 4, 5], [0, 2]]
    _feed(c, [0, 1, 2], [5, 5, 5], [2, 4, 0])
    assert _allowed(c, [0, 1, 2]) == [[EOS], [3, 4, 5, EOS], [0, 1, 2]]


def test_a_pattern_the_vocabulary_cannot_spell_may_only_end():
    c = _constraints()
    c.set_rows([_row(0, "z+", end=(EOS, 7))])
    assert _allowed(c, [0]) == [[EOS, 7]]


def test_after_the_end_token_the_row_stays_ended():
    c = _constraints()
    c.set_rows([_row(0, "[12]+")])
    _feed(c, [0], [5], [3])
    _feed(c, [0], [6], [EOS])  # a step planned ahead may still run after the end
    assert _allowed(c, [0]) == [[EOS]]
