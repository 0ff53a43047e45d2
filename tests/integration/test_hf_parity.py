"""Greedy output through the whole stack is token-identical to HF generate."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import torch

from radixmesh.benchmarks import quality_prompts

from ..conftest import all_threads

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MAX_NEW = 20

CHAT = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three colors.",
    "How do I boil an egg?",
    "Explain what a CPU does in one sentence.",
]
PLAIN = quality_prompts.PLAIN[:6]


def prompt_ids(tok) -> list[list[int]]:
    chats = [
        tok.apply_chat_template([{"role": "user", "content": c}], add_generation_prompt=True,
                                tokenize=True, return_dict=False)
        for c in CHAT
    ]
    chats = [list(c["input_ids"]) if isinstance(c, dict) else list(c) for c in chats]
    return chats + [tok(p).input_ids for p in PLAIN]


@pytest.fixture(scope="module")
def references(hf_model, hf_tokenizer):
    refs = []
    with all_threads():  # NOTE: the tests ask for it before the stack, which then starts
        for ids in prompt_ids(hf_tokenizer):
            out = hf_model.generate(torch.tensor([ids]), max_new_tokens=MAX_NEW, do_sample=False,
                                    pad_token_id=hf_tokenizer.eos_token_id)
            refs.append(out[0, len(ids):].tolist())
    return refs


def trim_eos(tokens: list[int], eos: set[int]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens


async def generate(client: httpx.AsyncClient, ids: list[int]) -> dict:
    resp = await client.post("/generate", json={
        "input_ids": ids, "sampling_params": {"max_new_tokens": MAX_NEW, "temperature": 0},
    })
    assert resp.status_code == 200, resp.text
    return resp.json()


async def test_one_at_a_time_matches_hf(references, stack, hf_tokenizer):
    eos = {hf_tokenizer.eos_token_id}
    async with httpx.AsyncClient(base_url=stack.url, timeout=300) as client:
        for ids, ref in zip(prompt_ids(hf_tokenizer), references):
            out = await generate(client, ids)
            assert out["output_ids"] == trim_eos(ref, eos), hf_tokenizer.decode(ids)


async def test_sixteen_at_once_match_hf(references, stack, hf_tokenizer):
    eos = {hf_tokenizer.eos_token_id}
    all_ids = prompt_ids(hf_tokenizer)
    cases = [(all_ids[i % len(all_ids)], references[i % len(all_ids)]) for i in range(16)]
    async with httpx.AsyncClient(base_url=stack.url, timeout=300) as client:
        outs = await asyncio.gather(*(generate(client, ids) for ids, _ in cases))
    for out, (ids, ref) in zip(outs, cases):
        assert out["output_ids"] == trim_eos(ref, eos), hf_tokenizer.decode(ids)


async def test_chat_text_matches_hf(stack, hf_model, hf_tokenizer):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    async with httpx.AsyncClient(base_url=stack.url, timeout=300) as client:
        resp = await client.post("/v1/chat/completions", json={
            "model": "SmolLM2-135M-Instruct", "messages": messages, "temperature": 0,
            "max_tokens": 30,
        })
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["choices"][0]["message"]["content"] == "The capital of France is Paris."
    assert body["choices"][0]["finish_reason"] == "stop"
