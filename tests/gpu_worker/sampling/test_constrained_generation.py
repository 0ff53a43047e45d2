"""Regex-constrained rows on the real model, batched with free rows."""

from __future__ import annotations

import re

from libs.protocol.messages import ForwardBatch, NewRow

from ..test_model_runner import GREEDY, _generate, _Slots

DATE = r"\d{4}-\d{2}-\d{2}"


def _run(runner, prompts, rows, new_rows, slots, steps, first_chunk=None):
    """Prefill (the first prompt in two chunks when ``first_chunk``), then decode;
    return each row's sampled tokens up to and including its first end id."""
    ends = set(runner.eos_token_ids)
    lens = [0] * len(prompts)
    if first_chunk:  # an earlier chunk of prompt 0: its sample must not count
        runner.execute(ForwardBatch(step=0, new_rows=new_rows[:1], rows=rows[:1], prefix_lens=[0],
                                    extend_lens=[first_chunk], input_ids=prompts[0][:first_chunk],
                                    out_slots=slots.take(first_chunk)))
        lens[0], new_rows = first_chunk, new_rows[1:]
    runs = [p[n:] for p, n in zip(prompts, lens)]
    outs = [[t] for t in runner.execute(ForwardBatch(
        step=1, new_rows=new_rows, rows=rows, prefix_lens=lens, extend_lens=[len(r) for r in runs],
        input_ids=[t for r in runs for t in r], out_slots=slots.take(sum(map(len, runs)))))]
    lens = [len(p) for p in prompts]
    for step in range(2, steps + 1):
        batch = ForwardBatch(step=step, new_rows=[], rows=rows, prefix_lens=lens,
                             extend_lens=[1] * len(rows), input_ids=[-1] * len(rows),
                             out_slots=slots.take(len(rows)))
        for o, t in zip(outs, runner.execute(batch)):
            o.append(t)
        lens = [n + 1 for n in lens]
    return [o[: next((i + 1 for i, t in enumerate(o) if t in ends), len(o))] for o in outs]


def test_constrained_rows_match_and_free_rows_are_untouched(runner, tokenizer):
    texts = ["The moon landing happened on the date", "Once upon a time there was",
             "Question: is water wet? Answer (yes or no):"]
    prompts = [tokenizer(t)["input_ids"] for t in texts]
    slots = _Slots(runner.config.kv_slots)
    free = _generate(runner, prompts[1:2], rows=[7], slots=slots, n=12)[0]
    ends = runner.eos_token_ids

    def row(r, i, regex):
        return NewRow(row=r, **GREEDY, regex=regex, regex_from=len(prompts[i]), end_ids=ends)

    new_rows = [row(2, 0, " " + DATE), NewRow(row=4, **GREEDY), row(9, 2, " (yes|no)")]
    outs = _run(runner, prompts, [2, 4, 9], new_rows, slots, steps=12, first_chunk=5)
    date, story, answer = (tokenizer.decode(o, skip_special_tokens=True) for o in outs)
    assert re.fullmatch(" " + DATE, date), date
    assert outs[0][-1] in ends and outs[2][-1] in ends
    assert re.fullmatch(" (yes|no)", answer), answer
    assert outs[1] == free[: len(outs[1])]  # the same tokens as alone, unconstrained
    assert len(outs[1]) == len(free) or outs[1][-1] in ends


def test_a_resumed_row_continues_its_pattern(runner, tokenizer):
    prompt = tokenizer("The moon landing happened on the date")["input_ids"]
    slots = _Slots(runner.config.kv_slots)
    ends = runner.eos_token_ids
    full = _run(runner, [prompt], [3], [NewRow(row=3, **GREEDY, regex=" " + DATE,
                                               regex_from=len(prompt), end_ids=ends)], slots, 12)[0]
    done = full[:4]  # resume after four tokens: prompt + output prefilled again
    again = _run(runner, [prompt + done], [5], [NewRow(
        row=5, **GREEDY, regex=" " + DATE, regex_from=len(prompt) + 4, regex_tokens=done,
        end_ids=ends)], slots, 12)[0]
    assert done + again == full
