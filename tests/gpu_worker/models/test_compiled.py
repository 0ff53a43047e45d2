"""The compiled step (inductor, padded to token buckets) against the eager step, on a tiny checkpoint."""

from __future__ import annotations

import pytest
import torch

from libs.protocol.messages import ForwardBatch, NewRow
from services.gpu_worker import ModelRunner, RunnerConfig
from services.gpu_worker.models.compiled import CompiledStep, cache_dir

from .test_llama_model import SMALL, _save_random

pytestmark = pytest.mark.slow  # one small compile (3 pieces, one bucket): ~20-60 s on 2 cores
GREEDY = dict(temperature=0.0, top_p=1.0, top_k=-1, seed=0)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("tiny")
    _save_random(LlamaForCausalLM(LlamaConfig(**SMALL)), path)
    make = lambda compile, ops="torch": ModelRunner(RunnerConfig(  # noqa: E731
        model=str(path), kv_slots=128, max_requests=4, dtype="float32", compile=compile, compile_sizes=(4,),
        compile_ops=ops))
    return make(False), make(True), make(True, "cpp")


def _steps() -> list[ForwardBatch]:
    new = [NewRow(row=r, **GREEDY) for r in (0, 2)]
    return [
        # 3 tokens -> padded to 4: a prefill of two requests
        ForwardBatch(step=0, new_rows=new, rows=[0, 2], prefix_lens=[0, 0], extend_lens=[2, 1],
                     input_ids=[5, 17, 250], out_slots=[40, 7, 90]),
        # 2 decode tokens -> padded to 4
        ForwardBatch(step=1, new_rows=[], rows=[0, 2], prefix_lens=[2, 1], extend_lens=[1, 1],
                     input_ids=[-1, -1], out_slots=[41, 3]),
        # 6 tokens: past the largest bucket, eager
        ForwardBatch(step=2, new_rows=[NewRow(row=1, **GREEDY)], rows=[0, 1], prefix_lens=[3, 0],
                     extend_lens=[1, 5], input_ids=[-1, 9, 44, 101, 12, 80], out_slots=[42, 60, 61, 62, 63, 64]),
    ]


@pytest.mark.parametrize("which", [1, 2], ids=["torch-ops", "cpp-ops"])
def test_compiled_steps_match_eager_and_padding_writes_no_slot(pair, which):
    eager, compiled = pair[0], pair[which]
    assert compiled.compiled.bucket(3) == 4 and compiled.compiled.bucket(5) is None
    for batch in _steps():
        want, got = eager.run(batch), compiled.run(batch)
        assert got.next_token_ids == want.next_token_ids
    for layer in range(len(eager.kv.k)):
        for ours, ref in ((compiled.kv.k[layer], eager.kv.k[layer]), (compiled.kv.v[layer], eager.kv.v[layer])):
            torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-5)
    written = {40, 7, 90, 41, 3, 42, 60, 61, 62, 63, 64}
    untouched = [s for s in range(compiled.kv.num_slots) if s not in written]
    assert not compiled.kv.k[0][untouched].any() and not compiled.kv.v[-1][untouched].any()


@pytest.mark.parametrize("which", [1, 2], ids=["torch-ops", "cpp-ops"])
def test_compiled_logits_close_to_eager(pair, which):
    eager, compiled = pair[0], pair[which]
    batch = ForwardBatch(step=0, new_rows=[NewRow(row=3, **GREEDY)], rows=[3], prefix_lens=[0], extend_lens=[3],
                         input_ids=[7, 8, 9], out_slots=[100, 101, 102])
    ref, got = eager.logits(batch), compiled.logits(batch)
    assert float((got - ref).abs().max() / ref.abs().max()) < 1e-4


def test_warm_up_reports_progress_and_uses_our_cache(pair, monkeypatch):
    compiled = pair[1]
    lines: list[str] = []
    assert isinstance(compiled.compiled, CompiledStep)
    compiled.compiled.warm_up(lines.append)
    assert lines[0] == "compiling the step for 4 tokens (1/1)" and "compiled step ready" in lines[-1]
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", "/tmp/rm-home")
    assert cache_dir().as_posix() == "/tmp/rm-home/.cache/radixmesh/inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/tmp/rm-elsewhere")
    assert cache_dir().as_posix() == "/tmp/rm-elsewhere"
