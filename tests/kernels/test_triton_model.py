"""The whole default model on the Triton backend (the interpreter on a CPU) agrees with HF transformers."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from libs.models import resolve_model  # noqa: E402
from libs.protocol.messages import ForwardBatch, NewRow  # noqa: E402
from services.gpu_worker import ModelRunner, RunnerConfig  # noqa: E402

GREEDY = dict(temperature=0.0, top_p=1.0, top_k=-1, seed=0)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.slow  # 15-30 s in the interpreter on 2 busy cores
def test_greedy_tokens_match_hf():
    """Prefill two prompts together (extend kernel), then decode both (split-K decode kernel)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    runner = ModelRunner(RunnerConfig(model=str(resolve_model()), attention_backend="triton", kv_slots=256,
                                    max_requests=4, device=DEVICE,
                                    dtype="float32"))
    tok = AutoTokenizer.from_pretrained(runner.path)
    prompts = [tok(p)["input_ids"] for p in ("The capital of France is", "def add(a, b):")]
    slots = iter(torch.randperm(256).tolist())
    lens = [len(p) for p in prompts]
    batch = ForwardBatch(
        step=0, new_rows=[NewRow(row=r, **GREEDY) for r in (2, 0)], rows=[2, 0], prefix_lens=[0, 0],
        extend_lens=lens, input_ids=prompts[0] + prompts[1], out_slots=[next(slots) for _ in range(sum(lens))],
    )
    outs = [[t] for t in runner.execute(batch)]
    for step in (1, 2):
        batch = ForwardBatch(
            step=step, new_rows=[], rows=[2, 0], prefix_lens=lens, extend_lens=[1, 1],
            input_ids=[o[-1] for o in outs], out_slots=[next(slots), next(slots)],
        )
        for o, t in zip(outs, runner.execute(batch)):
            o.append(t)
        lens = [n + 1 for n in lens]

    hf = AutoModelForCausalLM.from_pretrained(runner.path, dtype=torch.float32).eval().to(DEVICE)
    for ids, got in zip(prompts, outs):
        with torch.no_grad():
            ids_t = torch.tensor([ids], device=DEVICE)
            ref = hf.generate(
                ids_t, attention_mask=torch.ones_like(ids_t), do_sample=False, max_new_tokens=3, pad_token_id=2
            )[0, len(ids):].tolist()
        assert got == ref
