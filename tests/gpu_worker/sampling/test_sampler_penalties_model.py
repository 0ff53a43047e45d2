"""Penalties, logit_bias and min_tokens on the real model, greedy, against HF generate."""

from __future__ import annotations

import msgspec
import torch

from libs.protocol.extras import row_extras
from libs.protocol.messages import NewRow, SamplingParams

from .test_constrained_generation import _run
from ..test_model_runner import GREEDY, _Slots

STEPS = 16


def _row(row: int, prompt: list[int], **params) -> NewRow:
    extras = row_extras(SamplingParams(max_new_tokens=STEPS, **params), prompt, [])
    return NewRow(row=row, **GREEDY, extras=extras)


def _hf(hf_model, ids: list[int], steps: int = STEPS, **kwargs) -> list[int]:
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                do_sample=False, max_new_tokens=steps, pad_token_id=2, **kwargs)
    return out[0, len(ids):].tolist()


def test_repetition_penalty_and_logit_bias_match_hf_generate_in_one_batch(runner, hf_model, tokenizer):
    prompts = [tokenizer(t)["input_ids"] for t in
               ("The list of colors: red, blue, red, blue, red,", "def add(a, b):\n    return", "I like")]
    bias = {tokenizer(" cats")["input_ids"][0]: 15.0, tokenizer(" dogs")["input_ids"][0]: -100.0}
    new_rows = [_row(2, prompts[0], repetition_penalty=1.3), NewRow(row=5, **GREEDY),
                _row(8, prompts[2], logit_bias=bias)]
    outs = _run(runner, prompts, [2, 5, 8], new_rows, _Slots(runner.config.kv_slots), STEPS, first_chunk=6)
    assert outs[0] == _hf(hf_model, prompts[0], repetition_penalty=1.3)
    assert outs[0] != _hf(hf_model, prompts[0])[: len(outs[0])]  # the penalty changed the output
    assert outs[1] == _hf(hf_model, prompts[1])[: len(outs[1])]  # the free row is untouched
    sequence_bias = [[[t], b] for t, b in bias.items()]
    assert outs[2] == _hf(hf_model, prompts[2], sequence_bias=sequence_bias)
    cats, dogs = bias
    assert outs[2][0] == cats and dogs not in outs[2]


def test_min_tokens_holds_eos_back_as_hf_min_new_tokens(runner, hf_model, tokenizer):
    chat = [{"role": "user", "content": "Say hi."}]
    text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    prompt = tokenizer(text)["input_ids"]
    eos = set(runner.eos_token_ids)
    steps = 48
    free = _run(runner, [prompt], [1], [NewRow(row=1, **GREEDY)], _Slots(runner.config.kv_slots), steps)[0]
    assert free[-1] in eos and len(free) < steps - 8, free  # the model ends early by itself
    n = len(free) + 3
    held = _run(runner, [prompt], [1], [_row(1, prompt, min_tokens=n)], _Slots(runner.config.kv_slots), steps)[0]
    assert not eos & set(held[:n]) and len(held) > n
    want = _hf(hf_model, prompt, steps, min_new_tokens=n)
    assert held == want[: len(held)]


def test_a_resumed_row_keeps_its_counts(runner, tokenizer):
    """Retraction or a move to another worker: prompt + output prefilled again, the
    counts rebuilt from the NewRow, and the output goes on as if nothing happened."""
    prompt = tokenizer("Count: 1, 2, 3, 4, 5, 6,")["input_ids"]
    params = dict(frequency_penalty=0.8, presence_penalty=0.5, min_tokens=12)
    full = _run(runner, [prompt], [4], [_row(4, prompt, **params)], _Slots(runner.config.kv_slots), STEPS)[0]
    done = full[:5]
    extras = row_extras(SamplingParams(max_new_tokens=STEPS, **params), prompt, done)
    again = _run(runner, [prompt + done], [6], [NewRow(row=6, **GREEDY, extras=extras)],
                 _Slots(runner.config.kv_slots), STEPS - 5, first_chunk=7)[0]
    assert done + again == full
    forgot = msgspec.structs.replace(extras, output_ids=[])  # the counts not rebuilt
    lost = _run(runner, [prompt + done], [6], [NewRow(row=6, **GREEDY, extras=forgot)],
                _Slots(runner.config.kv_slots), STEPS - 5)[0]
    assert done + lost != full  # the control: without them it diverges
