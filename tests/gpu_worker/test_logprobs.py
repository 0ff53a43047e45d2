"""Prompt and output logprobs through the real SchedulerCore + ModelRunner (no bus) vs HF (fp32)."""

from __future__ import annotations

import math

import pytest
import torch

from libs.protocol import ServiceError
from libs.protocol.messages import ForwardBatch, ForwardResult, NewRow, SamplingParams, WorkerInfo
from services.scheduler.config import CoreConfig
from services.scheduler.core import SchedulerCore
from services.scheduler.request import Req

TEXT = "The quick brown fox jumps over the lazy dog. Then the dog wakes up and chases the fox."


def _batcher(runner, **cfg) -> SchedulerCore:
    info = WorkerInfo(worker_id="w", model="m", kv_slots=runner.config.kv_slots,
                      max_requests=runner.config.max_requests, max_model_len=runner.max_model_len,
                      vocab_size=runner.vocab_size, eos_token_ids=runner.eos_token_ids, dtype="float32")
    runner.table.zero_()
    return SchedulerCore(info, CoreConfig(**cfg))


def _drain(b: SchedulerCore, runner) -> dict:
    out: dict[str, dict] = {}
    while b.has_work():
        batch = b.next_batch()
        r = runner.run(batch)
        b.complete(ForwardResult(step=batch.step, next_token_ids=r.next_token_ids, forward_ms=0,
                                 logprobs=r.logprobs, top_ids=r.top_ids, top_logprobs=r.top_logprobs,
                                 top_k=r.top_k))
        for _, d in b.take_deltas():
            o = out.setdefault(d.rid, {"ids": [], "lp": [], "lp_ids": [], "top": [], "start": None})
            o["ids"] += d.token_ids
            if d.logprobs is not None:
                o["start"] = d.logprobs.start if o["start"] is None else o["start"]
                o["lp"] += d.logprobs.logprobs
                o["lp_ids"] += d.logprobs.token_ids
                o["top"] += d.logprobs.top_ids
            if d.finish_reason:
                o["finish"], o["cached"] = d.finish_reason, d.cached_tokens
    return out


def _req(rid, ids, max_new, **sp) -> Req:
    return Req(rid=rid, input_ids=ids, detok_instance="t",
               sampling=SamplingParams(max_new_tokens=max_new, temperature=0.0, **sp))


def _hf_logprobs(hf_model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = hf_model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, -1)


def test_prompt_logprobs_match_hf_across_chunks_and_cache(runner, hf_model, tokenizer):
    ids = tokenizer(TEXT)["input_ids"]
    ref = _hf_logprobs(hf_model, ids)
    want = ref[:-1].gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1)
    b = _batcher(runner, chunked_prefill_size=7)
    # prefill only: the prompt is cached afterwards
    out = _drain(b, runner) if b.submit(_req("warm", ids[:12], 0)) is not None else None
    assert out["warm"]["ids"] == [] and out["warm"]["finish"] == "length"
    b.submit(_req("lp", ids, 2, return_logprob=True, logprob_start_len=0, top_logprobs_num=3))
    b.submit(_req("tail", ids, 0, return_logprob=True, logprob_start_len=9))
    b.submit(_req("plain", ids, 0))
    out = _drain(b, runner)
    lp = out["lp"]
    assert lp["start"] == 0 and math.isnan(lp["lp"][0]) and lp["top"][0] == []
    assert lp["lp_ids"][: len(ids)] == ids and lp["lp_ids"][len(ids):] == lp["ids"]
    assert len(lp["lp"]) == len(ids) + 2
    torch.testing.assert_close(torch.tensor(lp["lp"][1 : len(ids)]), want, atol=1e-4, rtol=1e-4)
    top = ref[:-1].topk(3, -1).indices[1:].tolist()
    assert lp["top"][2 : len(ids)] == top[: len(ids) - 2]
    # the first output token is the greedy one, its logprob the maximum
    assert lp["ids"][0] == int(ref[-1].argmax()) and abs(lp["lp"][len(ids)] - float(ref[-1].max())) < 1e-4
    tail = out["tail"]
    assert tail["start"] == 9 and tail["lp_ids"] == ids[9:] and tail["ids"] == []
    torch.testing.assert_close(torch.tensor(tail["lp"]), want[8:], atol=1e-4, rtol=1e-4)
    assert 0 < tail["cached"] <= 8  # cached prefix capped: positions 8.. are computed
    assert out["plain"]["cached"] == len(ids) - 1  # the whole prompt was cached by then


def test_output_logprobs_only_and_invalid(runner, hf_model, tokenizer):
    ids = tokenizer(TEXT)["input_ids"][:10]
    b = _batcher(runner)
    b.submit(_req("o", ids, 3, return_logprob=True))
    o = _drain(b, runner)["o"]
    assert o["start"] == len(ids) and o["lp_ids"] == o["ids"] and len(o["lp"]) == 3
    ref = _hf_logprobs(hf_model, ids + o["ids"])
    want = [float(ref[len(ids) - 1 + i, t]) for i, t in enumerate(o["ids"])]
    torch.testing.assert_close(torch.tensor(o["lp"]), torch.tensor(want), atol=1e-4, rtol=1e-4)
    with pytest.raises(ServiceError):
        b.submit(_req("bad", ids, 1, return_logprob=True, top_logprobs_num=99))
    bad = ForwardBatch(step=1, new_rows=[NewRow(row=0, temperature=0, top_p=1, top_k=-1, seed=0)],
                       rows=[0], prefix_lens=[0], extend_lens=[3], input_ids=ids[:3],
                       out_slots=[0, 1, 2], logprob_from=[1], logprob_count=[3], logprob_next=[-1],
                       top_logprobs_num=[0])
    with pytest.raises(ServiceError, match="inside"):
        runner.run(bad)


def test_retraction_reports_every_position_once(runner, tokenizer):
    ids = tokenizer(TEXT)["input_ids"]
    outs = []
    for cfg in ({}, {"retract_interval": 2}):
        b = _batcher(runner, chunked_prefill_size=6, **cfg)
        b.submit(_req("a", ids[:15], 5, return_logprob=True, logprob_start_len=3, top_logprobs_num=1))
        b.submit(_req("b", ids[2:], 5, return_logprob=True))
        outs.append((_drain(b, runner), b.stats().retractions))
    (plain, _), (retracted, n) = outs
    assert n > 0
    for rid in "ab":
        assert retracted[rid]["lp_ids"] == plain[rid]["lp_ids"] and retracted[rid]["ids"] == plain[rid]["ids"]
        torch.testing.assert_close(torch.tensor(retracted[rid]["lp"]), torch.tensor(plain[rid]["lp"]),
                                   atol=1e-4, rtol=1e-4)
    assert plain["a"]["start"] == 3 and len(plain["a"]["lp"]) == 12 + 5
    assert plain["b"]["start"] == len(ids) - 2 and plain["b"]["lp_ids"] == plain["b"]["ids"]
