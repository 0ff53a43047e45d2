"""KV copies on the real model: a prefix exported (or saved to the host pool), its device
slots zeroed, loaded back by a ForwardBatch's copies: greedy decoding as if it never moved."""

from __future__ import annotations

import pytest
import torch

from libs.models import resolve_model
from libs.protocol import ServiceError
from libs.protocol.messages import ForwardBatch, KVCopy, NewRow
from services.gpu_worker import ModelRunner, RunnerConfig

GREEDY = dict(temperature=0.0, top_p=1.0, top_k=-1, seed=0)
PROMPT = ("The lighthouse keeper climbed the stairs every evening, counting each step as his "
          "father had taught him, and at the top he lit the lamp and watched the ships")
N = 12


class _Run:
    """One runner, fresh slots and increasing step numbers."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.free = torch.randperm(runner.config.kv_slots, generator=torch.Generator().manual_seed(1)).tolist()
        self.step = 0

    def slots(self, n: int) -> list[int]:
        out, self.free = self.free[:n], self.free[n:]
        return out

    def send(self, copies=(), **fields) -> list[int]:
        self.step += 1
        empty = dict(new_rows=[], rows=[], prefix_lens=[], extend_lens=[], input_ids=[], out_slots=[])
        return self.runner.execute(ForwardBatch(step=self.step, copies=list(copies), **dict(empty, **fields)))

    def prefill(self, row: int, ids: list[int]) -> tuple[list[int], int]:
        slots = self.slots(len(ids))
        [first] = self.send(new_rows=[NewRow(row=row, **GREEDY)], rows=[row], prefix_lens=[0],
                            extend_lens=[len(ids)], input_ids=ids, out_slots=slots)
        return slots, first

    def continue_from(self, row: int, prefix_slots: list[int], token: int, copies=()) -> list[int]:
        """A new row starting from ``prefix_slots``, fed ``token``, then N - 1 greedy decodes;
        ``copies`` ride its first step."""
        length = len(prefix_slots)
        out = self.send(copies, new_rows=[NewRow(row=row, prefix_slots=prefix_slots, **GREEDY)], rows=[row],
                        prefix_lens=[length], extend_lens=[1], input_ids=[token], out_slots=self.slots(1))
        for i in range(1, N):
            out += self.send(rows=[row], prefix_lens=[length + i], extend_lens=[1], input_ids=[out[-1]],
                             out_slots=self.slots(1))
        return out


@pytest.fixture(scope="module")
def run() -> _Run:
    torch.set_num_threads(1)
    config = RunnerConfig(model=str(resolve_model()), kv_slots=2048, max_requests=8, dtype="float32",
                          host_kv_slots=512)
    return _Run(ModelRunner(config))


@pytest.fixture(scope="module")
def prompt(run) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(run.runner.path)(PROMPT)["input_ids"]


@pytest.fixture(scope="module")
def reference(run, prompt) -> tuple[int, list[int]]:
    """The first token and the N greedy tokens after it, KV never moved."""
    slots, first = run.prefill(0, prompt)
    return first, run.continue_from(1, slots, first)


def _zero(runner: ModelRunner, slots: list[int]) -> None:
    for t in runner.kv.k + runner.kv.v:
        t[slots] = 0.0


def _damaged(run: _Run, slots: list[int], first: int, reference: list[int]) -> None:
    """With the prefix's slots zeroed, decoding really differs (the test can fail)."""
    _zero(run.runner, slots)
    assert run.continue_from(7, slots, first) != reference


def test_export_zero_import_decodes_as_never_moved(run, prompt, reference):
    first, expected = reference
    slots, got_first = run.prefill(2, prompt)
    assert got_first == first
    assert run.send([KVCopy(kind="export", src=slots, buffer="prefix")]) == []  # a copy-only step
    assert "prefix" in run.runner.kv_copies.staging
    _damaged(run, slots, first, expected)
    # the import rides the very step that first reads those slots
    assert run.continue_from(3, slots, first, [KVCopy(kind="import", dst=slots, buffer="prefix")]) == expected
    assert "prefix" not in run.runner.kv_copies.staging


def test_device_to_host_and_back_into_other_slots_decodes_as_never_moved(run, prompt, reference):
    first, expected = reference
    slots, _ = run.prefill(4, prompt)
    host = list(range(100, 100 + len(slots)))
    run.send([KVCopy(kind="d2h", src=slots, dst=host)])
    _damaged(run, slots, first, expected)
    fresh = run.slots(len(slots))  # loaded where the allocator now has room, not where it was
    assert run.continue_from(5, fresh, first, [KVCopy(kind="h2d", src=host, dst=fresh)]) == expected


def test_a_bad_copy_fails_the_whole_step_before_anything_runs(run, prompt):
    slots = run.slots(len(prompt))
    k0, host0 = run.runner.kv.k[0][slots].clone(), run.runner.kv_copies.host.data[:2].clone()
    step = run.step
    bad = [KVCopy(kind="d2h", src=slots[:2], dst=[0, 1]), KVCopy(kind="import", dst=slots[:2], buffer="gone")]
    with pytest.raises(ServiceError) as err:
        run.send(bad, new_rows=[NewRow(row=6, **GREEDY)], rows=[6], prefix_lens=[0],
                 extend_lens=[len(prompt)], input_ids=prompt, out_slots=slots)
    assert err.value.status == 400 and "no transfer buffer 'gone'" in err.value.message
    assert torch.equal(run.runner.kv.k[0][slots], k0)  # the forward did not write its slots
    assert torch.equal(run.runner.kv_copies.host.data[:2], host0)  # nor the first copy its host slots
    run.step = step
    with pytest.raises(ServiceError):  # no rows and no copies is still an empty batch
        run.send()
