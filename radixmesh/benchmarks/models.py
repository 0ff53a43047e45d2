"""Models side by side in one run: ``python -m radixmesh.benchmarks.models``.

Decode tokens/s of each model's ModelRunner (worker_step.bench_decode: every request starts
with ``--context`` cached tokens, each step decodes one token per request), the models taking
turns batch by batch, round after round (medians: this machine is noisy); and with
``--agreement``, how many of the Gemma 3 270M parity prompts (tests/integration/test_gemma3_270m.py)
each model's ``--dtype`` run answers with HF fp32's greedy tokens, token for token.

    python -m radixmesh.benchmarks.models --models default gemma3-270m --dtype bfloat16 --agreement
"""

from __future__ import annotations

import argparse
import statistics

import torch

from libs.models import resolve_model, served_name
from libs.protocol.messages import ForwardBatch, NewRow
from services.gpu_worker.model_runner import ModelRunner, RunnerConfig

from .worker_step import bench_decode

CHAT = ["What is the capital of France?", "Write a haiku about the sea.", "List three colors.",
        "How do I boil an egg?", "Explain what a CPU does in one sentence.", "Translate 'good morning' into Spanish.",
        "What is 12 times 7?", "Name a famous painter.", "Give me a word that rhymes with cat.", "Why is the sky blue?",
        "Suggest a name for a pet fish.", "What is the opposite of hot?"]
PLAIN = ["The capital of France is", "The quick brown fox", "def fibonacci(n):", "Once upon a time, in a small village,",
         "1, 2, 3, 4, 5,", "The three primary colors are", "Water boils at a temperature of",
         "The largest planet in the solar system is", "import numpy as np\n", "In 1492, Columbus", "My favourite food is",
         "The meaning of life is"]


def greedy(runner: ModelRunner, ids: list[int], n: int) -> list[int]:
    """``n`` greedy tokens of one prompt (up to and with an eos id), a step at a time."""
    out, eos = [], set(runner.eos_token_ids)
    feed, length = ids, 0
    new = [NewRow(row=0, temperature=0.0, top_p=1.0, top_k=-1, seed=0)]
    for step in range(n):
        token = runner.execute(ForwardBatch(step=step, new_rows=new if step == 0 else [], rows=[0], prefix_lens=[length],
                                            extend_lens=[len(feed)], input_ids=feed,
                                            out_slots=list(range(length, length + len(feed)))))[0]
        length += len(feed)
        out.append(token)
        if token in eos:
            break
        feed = [token]
    return out


def agreement(model: str, dtype: str, n: int) -> tuple[int, int]:
    """(prompts whose ``dtype`` greedy tokens equal HF fp32's, prompts)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model(model)
    tok = AutoTokenizer.from_pretrained(path)
    prompts = [list(tok.apply_chat_template([{"role": "user", "content": c}], add_generation_prompt=True,
                                            tokenize=True, return_dict=False)) for c in CHAT]
    prompts += [tok(p).input_ids for p in PLAIN]
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    runner = ModelRunner(RunnerConfig(model=str(path), dtype=dtype, kv_slots=1024, max_requests=1, max_model_len=512))
    same = 0
    with torch.no_grad():
        for ids in prompts:
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)[0, len(ids):].tolist()
            got = greedy(runner, ids, n)
            same += got == ref[: len(got)] and (len(got) == len(ref) or got[-1] in runner.eos_token_ids)
    return same, len(prompts)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["default", "gemma3-270m"])
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batches", default="1,8")
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--agreement", action="store_true", help="also greedy agreement with HF fp32 (24 prompts, 16 tokens)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    slots = max(batches) * (args.context + args.steps + 3)
    runners = {m: ModelRunner(RunnerConfig(model=str(resolve_model(m)), dtype=args.dtype, kv_slots=slots,
                                           max_requests=max(batches), max_model_len=512)) for m in args.models}
    samples = {(m, b): [] for m in args.models for b in batches}
    for _ in range(args.rounds):
        for b in batches:
            for m, runner in runners.items():
                samples[m, b].append(b / bench_decode(runner, b, args.context, args.steps))
    dtypes = {runner.config.dtype for runner in runners.values()}
    print(f"\ndecode tokens/s, {args.context}-token contexts, {args.steps} steps, {'/'.join(dtypes)}, "
          f"{args.threads} threads, median of {args.rounds} interleaved rounds")
    print("| model | linears | " + " | ".join(f"batch {b}" for b in batches) + " |")
    print("|---|---|" + "---|" * len(batches))
    for m, runner in runners.items():
        cells = " | ".join(f"{statistics.median(samples[m, b]):.1f}" for b in batches)
        print(f"| {served_name(m)} | {runner.model.linear_kernel} | {cells} |")
    if args.agreement:
        del runners
        for m in args.models:
            same, total = agreement(m, args.dtype, 16)
            print(f"{served_name(m)} {args.dtype}: greedy identical to HF fp32 on {same}/{total} prompts (16 tokens)")


if __name__ == "__main__":
    main()
