"""Penalties, logit_bias and min_tokens through the real stack, against HF generate (greedy)."""

from __future__ import annotations

import httpx
import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "SmolLM2-135M-Instruct"
STEPS = 20


class OpenAIPenalties(LogitsProcessor):
    """OpenAI's presence / frequency penalties over the generated tokens (HF has none)."""

    def __init__(self, prompt_len: int, presence: float, frequency: float) -> None:
        self.prompt_len, self.presence, self.frequency = prompt_len, presence, frequency

    def __call__(self, input_ids, scores):
        counts = torch.zeros_like(scores)
        out = input_ids[:, self.prompt_len:]
        counts.scatter_add_(1, out, torch.ones_like(out, dtype=scores.dtype))
        return scores - self.frequency * counts - self.presence * (counts > 0)


def _hf(hf_model, ids: list[int], **kwargs) -> list[int]:
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                do_sample=False, max_new_tokens=STEPS, pad_token_id=2, **kwargs)
    return out[0, len(ids):].tolist()


def _generate(stack, ids: list[int], **params) -> dict:
    body = {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": STEPS, **params}}
    resp = httpx.post(f"{stack.url}/generate", json=body, timeout=300)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _strip_eos(ids: list[int], eos: int) -> list[int]:
    return ids[: ids.index(eos) + 1] if eos in ids else ids


def test_penalties_and_bias_match_hf_greedy(stack, hf_model, hf_tokenizer):
    eos = hf_tokenizer.eos_token_id
    ids = hf_tokenizer("The list of colors: red, blue, red, blue, red,")["input_ids"]
    got = _generate(stack, ids, repetition_penalty=1.3)["output_ids"]
    assert got == _strip_eos(_hf(hf_model, ids, repetition_penalty=1.3), eos)
    got = _generate(stack, ids, presence_penalty=1.5, frequency_penalty=0.5)["output_ids"]
    processors = LogitsProcessorList([OpenAIPenalties(len(ids), 1.5, 0.5)])
    assert got == _strip_eos(_hf(hf_model, ids, logits_processor=processors), eos)
    plain = _generate(stack, ids)["output_ids"]
    assert got != plain
    banned = plain[0]
    got = _generate(stack, ids, logit_bias={str(banned): -100})["output_ids"]
    assert banned not in got
    assert got == _strip_eos(_hf(hf_model, ids, sequence_bias=[[[banned], -100.0]]), eos)


def test_chat_logit_bias_and_min_tokens(stack, hf_tokenizer):
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "temperature": 0,
            "max_tokens": 60}
    url = f"{stack.url}/v1/chat/completions"
    free = httpx.post(url, json=chat, timeout=300).json()
    assert free["choices"][0]["finish_reason"] == "stop"
    n = free["usage"]["completion_tokens"] + 5
    held = httpx.post(url, json={**chat, "min_tokens": n}, timeout=300).json()
    assert held["usage"]["completion_tokens"] >= n
    assert held["choices"][0]["message"]["content"].startswith(free["choices"][0]["message"]["content"])
    token = hf_tokenizer(" banana")["input_ids"][0]
    forced = httpx.post(url, json={**chat, "max_tokens": 3, "logit_bias": {str(token): 100}}, timeout=300).json()
    assert forced["choices"][0]["message"]["content"] == " banana" * 3


def test_completion_min_tokens_with_stop_token_ids(stack, hf_tokenizer):
    ids = hf_tokenizer("1, 2, 3, 4,")["input_ids"]
    comma = hf_tokenizer(",")["input_ids"][0]
    body = {"model": MODEL, "prompt": ids, "temperature": 0, "max_tokens": 12, "stop_token_ids": [comma]}
    url = f"{stack.url}/v1/completions"
    short = httpx.post(url, json=body, timeout=300).json()
    n = short["usage"]["completion_tokens"]
    assert short["choices"][0]["finish_reason"] == "stop" and n <= 4  # " 5," ends at its comma
    held = httpx.post(url, json={**body, "min_tokens": n + 4}, timeout=300).json()
    assert held["usage"]["completion_tokens"] >= n + 4


def test_logit_bias_past_the_vocabulary_is_a_400(stack):
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "logit_bias": {"49152": 1}}
    resp = httpx.post(f"{stack.url}/v1/completions", json=body, timeout=300)
    assert resp.status_code == 400, resp.text
    assert "logit_bias" in resp.json()["error"]["message"]
