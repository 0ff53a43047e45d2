"""radixmesh.lang and the API it needs (max_tokens 0, prompt logprobs) on the real stack."""

from __future__ import annotations

import asyncio
import math

import httpx
import pytest
import torch

from libs.protocol import Bus
from libs.protocol.messages import KVSnapshot, SnapshotRequest
from radixmesh import lang as rl

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "SmolLM2-135M-Instruct"
DOC = ("The handbook says that every new employee receives a laptop, a badge and a desk. "
       "Security training happens in the first week, and the cafeteria opens at eight.")


@pytest.fixture(scope="module")
def runtime(stack):
    with rl.Runtime(stack.url) as rt:
        yield rt


@pytest.fixture(scope="module")
def page_size(stack, stack_bus) -> int:
    async def ask() -> int:
        worker = (await stack_bus.workers()).workers[0].worker_id
        bus = await Bus.connect(stack.nats_url, "test-lang")
        try:
            snap = await bus.request(stack_bus.subjects.sched_snapshot(worker), SnapshotRequest(),
                                     KVSnapshot)
        finally:
            await bus.close()
        return snap.page_size

    return asyncio.run(ask())


def _page_aligned(text: str, tokenizer, page: int) -> str:
    """``text`` + filler words + newline, a whole number of cache pages long in tokens
    (the scheduler caches whole pages only)."""
    out = text + "\n"
    while len(tokenizer(out)["input_ids"]) % page:
        out = out[:-1] + " ok\n"
    return out


@rl.function
def three_questions(s, doc):
    s += doc
    branches = s.fork(3)
    for b, q in zip(branches, ["Who gets a laptop?", "When is training?", "When does it open?"]):
        # NOTE: a stop string ends a branch in the tokenizer, before the scheduler's finish
        b += "Question: " + q + "\nAnswer:" + rl.gen("answer", max_tokens=8, stop=["\n", "."])
    s.join(branches)
    s += "Summary:" + rl.gen("summary", max_tokens=8)


def test_fork_branches_hit_the_held_prefix_and_order_does_not_matter(runtime, hf_tokenizer,
                                                                     page_size):
    doc = _page_aligned("Handbook (fork test). " + DOC, hf_tokenizer, page_size)
    shared = len(hf_tokenizer(doc)["input_ids"])
    s = three_questions.run(doc=doc, runtime=runtime)
    assert s.calls[0].kind == "hold" and s.calls[0].usage.prompt_tokens == shared
    assert s.calls[0].usage.completion_tokens == 0
    cached = [b.calls[0].usage.cached_tokens for b in s.branches]
    assert all(c >= shared for c in cached), (cached, shared)
    one_by_one = three_questions.run(doc=doc, runtime=runtime, concurrent=False)
    assert one_by_one.variables() == s.variables() and one_by_one.text() == s.text()
    assert len(s["answer"]) == 3


def _hf_logprobs(hf_model, ids: list[int]) -> torch.Tensor:
    """log p(ids[i] | ids[:i]) for i >= 1."""
    with torch.no_grad():
        logits = hf_model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1)


def test_select_picks_what_a_direct_logprob_computation_picks(runtime, hf_model, hf_tokenizer):
    prefix = "Question: What is the capital of France?\nAnswer:"
    choices = [" London", " Paris", " Berlin", " a banana"]

    @rl.function
    def capital(s):
        s += prefix + rl.select("city", choices)

    direct = []
    for choice in choices:
        enc = hf_tokenizer(prefix + choice, return_offsets_mapping=True)
        lps = _hf_logprobs(hf_model, enc["input_ids"])
        # the choice's tokens: those holding any of its characters (as the library does)
        direct.append(sum(float(lps[i - 1]) for i, (_, end) in enumerate(enc["offset_mapping"])
                          if i > 0 and end > len(prefix)))
    state = capital.run(runtime=runtime)
    assert state["city"] == choices[max(range(len(choices)), key=lambda i: direct[i])]
    assert state.calls[0].kind == "select" and len(state.calls) == 1  # one batched request
    scores, _ = runtime.submit(runtime.client.score(prefix, choices)).result()
    assert [sum(s) for s in scores] == pytest.approx(direct, abs=1e-3)


def test_prompt_logprobs_match_hf_also_after_a_prefill_only_request(stack, hf_model, hf_tokenizer,
                                                                    page_size):
    head = _page_aligned("Logprob test. " + DOC, hf_tokenizer, page_size)
    text = head + "Question: what happens in the first week?"
    ids = hf_tokenizer(text)["input_ids"]
    want = _hf_logprobs(hf_model, ids)
    with httpx.Client(base_url=stack.url, timeout=300) as client:
        def post(path, body):
            resp = client.post(path, json=body)
            assert resp.status_code == 200, resp.text
            return resp.json()

        held = post("/v1/completions", {"model": MODEL, "prompt": head, "max_tokens": 0})
        assert held["choices"][0]["text"] == "" and held["choices"][0]["finish_reason"] == "length"
        assert held["usage"]["completion_tokens"] == 0
        hit = post("/v1/completions", {"model": MODEL, "prompt": head + "Hello", "max_tokens": 1})
        assert hit["usage"]["prompt_tokens_details"]["cached_tokens"] >= held["usage"]["prompt_tokens"]
        body = post("/v1/completions", {"model": MODEL, "prompt": [text, head], "max_tokens": 0,
                                        "echo": True, "logprobs": 2})
        native = post("/generate", {"text": text, "sampling_params": {"max_new_tokens": 1},
                                    "return_logprob": True, "logprob_start_len": len(ids) - 3})
    first, second = body["choices"]
    assert (first["index"], second["index"]) == (0, 1) and first["text"] == text
    lp = first["logprobs"]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert "".join(lp["tokens"]) == text and len(lp["tokens"]) == len(ids)
    torch.testing.assert_close(torch.tensor(lp["token_logprobs"][1:]), want, atol=1e-4, rtol=1e-4)
    assert all(len(top) <= 2 and max(top.values()) >= v - 1e-5
               for top, v in zip(lp["top_logprobs"][1:], lp["token_logprobs"][1:]))
    assert lp["text_offset"][:3] == [0, len(lp["tokens"][0]), len(lp["tokens"][0] + lp["tokens"][1])]
    assert second["logprobs"]["tokens"] == lp["tokens"][: len(second["logprobs"]["tokens"])]
    inputs = native["meta_info"]["input_token_logprobs"]
    assert [t for _, t, _ in inputs] == ids[-3:]
    assert [v for v, _, _ in inputs] == pytest.approx(want[-3:].tolist(), abs=1e-4)
    (out_lp, out_id, _), = native["meta_info"]["output_token_logprobs"]
    assert out_id == native["output_ids"][0] and out_lp <= 0 and not math.isnan(out_lp)


def test_chat_fork_branches_hit_the_rendered_conversation(runtime, hf_tokenizer, page_size):
    """Chat programs hold the shared messages through /v1/chat/completions (max_tokens 0):
    a ChatML template renders each message on its own, so the rendering of the shared
    messages is a token prefix of every branch's prompt."""
    doc = "Handbook (chat fork test). " + DOC

    def shared_messages(d: str) -> list[dict]:
        return [{"role": "system", "content": "Answer in one short sentence."},
                {"role": "user", "content": "Read this handbook:\n" + d}]

    def rendered(d: str) -> int:
        return len(hf_tokenizer.apply_chat_template(shared_messages(d), tokenize=True,
                                                    add_generation_prompt=False)["input_ids"])

    while rendered(doc) % page_size:  # the scheduler caches whole pages only
        doc += " ok"

    @rl.function
    def chat(s):
        for m in shared_messages(doc):
            s += getattr(rl, m["role"])(m["content"])
        branches = s.fork(3)
        for b, q in zip(branches, ["Who gets a laptop?", "When is training?", "When is lunch?"]):
            b += rl.user(q)
            b += rl.assistant(rl.gen("answer", max_tokens=6))
        s.join(branches)

    s = chat.run(runtime=runtime)
    cached = [b.calls[0].usage.cached_tokens for b in s.branches]
    assert all(c >= rendered(doc) for c in cached), (cached, rendered(doc))
    assert len(s["answer"]) == 3 and all(isinstance(a, str) for a in s["answer"])
