"""What regex-constrained generation costs, measured side by side in one run.

1. Compiling: the vocabulary's token texts (once per worker), then each pattern
   into a token automaton (once per pattern; cached after): seconds, states, MB.
2. Decoding: the worker's ModelRunner steps with every row free vs every row
   constrained, interleaved rounds, median step time per batch size.
3. Joining: 8 rows decode while a row with a never-seen pattern joins; that
   step's time with the pattern compiled inside it vs announced a few steps
   before (as the scheduler does at submit).

    python -m radixmesh.benchmarks.constrained [--batches 1 8 32] [--steps 16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from libs.grammar.regex_fsm import Vocab, compile_regex, token_texts
from libs.models import resolve_model
from libs.protocol.messages import ForwardBatch, NewRow
from services.gpu_worker.model_runner import ModelRunner, RunnerConfig

PATTERNS = {
    "yes/no": r"(yes|no)",
    "date": r"\d{4}-\d{2}-\d{2}",
    "name": r"[A-Z][a-z]+( [A-Z][a-z]+)*",
    "email": r"[a-z0-9._]{1,20}@[a-z]{1,12}\.(com|org|net)",
    "json": r'\{"name": "[^"]{1,20}", "age": \d{1,3}\}',
    "sentence": r"[A-Za-z ,]{1,200}\.",
}
DECODE_PATTERN = r"[a-z ]{1,400}"  # never complete within the benchmark's steps
GREEDY = dict(temperature=0.0, top_p=1.0, top_k=-1, seed=0)


def compile_table(runner: ModelRunner) -> list[str]:
    from transformers import AutoTokenizer

    start = time.perf_counter()
    texts = token_texts(AutoTokenizer.from_pretrained(runner.path), runner.vocab_size)
    vocab = Vocab(texts)
    usable = sum(t is not None for t in texts)
    lines = [f"token texts + vocabulary: {time.perf_counter() - start:.2f} s "
             + f"({usable:,} of {len(texts):,} ids usable)", "",
             "| pattern | regex | compile (s) | states | table (MB) |", "|---|---|---|---|---|"]
    for name, pattern in PATTERNS.items():
        start = time.perf_counter()
        fsm = compile_regex(pattern, vocab)
        took = time.perf_counter() - start
        cell = pattern.replace("|", "\\|")  # NOTE: a markdown cell
        lines.append(f"| {name} | `{cell}` | {took:.3f} | {fsm.num_states} | "
                     f"{fsm.nbytes / 2**20:.1f} |")
    return lines


def step_times(runner: ModelRunner, batch: int, steps: int, regex: str, base_row: int) -> list[float]:
    """Prefill ``batch`` rows of 64 tokens, then time ``steps`` decode steps each."""
    rows = list(range(base_row, base_row + batch))
    ends = runner.eos_token_ids
    new = [NewRow(row=r, **GREEDY, regex=regex, regex_from=64, end_ids=ends if regex else [])
           for r in rows]
    ids = np.random.default_rng(batch).integers(1000, 20000, size=batch * 64).tolist()
    slot = iter(range(runner.config.kv_slots))
    runner.execute(ForwardBatch(step=0, new_rows=new, rows=rows, prefix_lens=[0] * batch,
                                extend_lens=[64] * batch, input_ids=ids,
                                out_slots=[next(slot) for _ in ids]))
    times = []
    for s in range(1, steps + 1):
        batch_msg = ForwardBatch(step=s, new_rows=[], rows=rows, prefix_lens=[63 + s] * batch,
                                 extend_lens=[1] * batch, input_ids=[-1] * batch,
                                 out_slots=[next(slot) for _ in rows])
        start = time.perf_counter()
        runner.execute(batch_msg)
        times.append(time.perf_counter() - start)
    return times


def decode_table(runner: ModelRunner, batches: list[int], steps: int, rounds: int) -> list[str]:
    lines = ["| batch | free step (ms) | constrained step (ms) | constrained / free |",
             "|---|---|---|---|"]
    step_times(runner, batches[0], 2, DECODE_PATTERN, 0)  # compile + warm up, not timed
    for b in batches:
        free, constrained = [], []
        for _ in range(rounds):  # NOTE: interleaved, so machine noise hits both alike
            free += step_times(runner, b, steps, "", 0)
            constrained += step_times(runner, b, steps, DECODE_PATTERN, 0)
        f, c = statistics.median(free) * 1e3, statistics.median(constrained) * 1e3
        lines.append(f"| {b} | {f:.1f} | {c:.1f} | {c / f:.2f} |")
    return lines


JOIN_PATTERNS = [r"[A-Za-z ,]{1,200}\.", r"[a-z ,]{1,180}!", r"[A-Z ]{1,190}\?",
                 r"[0-9a-z ]{1,200};", r"[a-f ]{1,150}#", r"[b-y ]{1,170}@"]


def join_step(runner: ModelRunner, pattern: str, announce: bool) -> tuple[float, float]:
    """(ms of the step where a row constrained by ``pattern`` joins 8 decoding rows,
    median ms of the steps before it)."""
    rows, slot = list(range(8)), iter(range(runner.config.kv_slots))
    ids = np.random.default_rng(0).integers(1000, 20000, size=8 * 32).tolist()
    runner.execute(ForwardBatch(step=0, new_rows=[NewRow(row=r, **GREEDY) for r in rows], rows=rows,
                                prefix_lens=[0] * 8, extend_lens=[32] * 8, input_ids=ids,
                                out_slots=[next(slot) for _ in ids]))
    times = []
    for s in range(1, 7):
        joins = s == 6
        if s == 2 and announce:
            runner.constraints.prepare([pattern])
        new = [NewRow(row=8, **GREEDY, regex=pattern, regex_from=4, end_ids=runner.eos_token_ids)]
        batch = ForwardBatch(step=s, new_rows=new if joins else [], rows=rows + [8] * joins,
                             prefix_lens=[31 + s] * 8 + [0] * joins, extend_lens=[1] * 8 + [4] * joins,
                             input_ids=[-1] * 8 + [1000, 1001, 1002, 1003] * joins,
                             out_slots=[next(slot) for _ in range(8 + 4 * joins)])
        start = time.perf_counter()
        runner.execute(batch)
        times.append(time.perf_counter() - start)
    return times[-1] * 1e3, statistics.median(times[:-1]) * 1e3


def join_table(runner: ModelRunner) -> list[str]:
    lines = ["| new pattern | compiled | join step (ms) | other steps (ms) |", "|---|---|---|---|"]
    for i, pattern in enumerate(JOIN_PATTERNS):  # NOTE: alternating, each pattern unseen
        announce = i % 2 == 1
        join, other = join_step(runner, pattern, announce)
        lines.append(f"| `{pattern}` | {'announced ahead' if announce else 'in the step'} | "
                     f"{join:.0f} | {other:.0f} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    runner = ModelRunner(RunnerConfig(model=str(resolve_model()),
                                      kv_slots=max(max(args.batches) * (64 + args.steps + 1), 512),
                                      max_requests=max(max(args.batches), 9)))
    print("\n".join(compile_table(runner)))
    print()
    print("\n".join(decode_table(runner, args.batches, args.steps, args.rounds)))
    print()
    print("\n".join(join_table(runner)))


if __name__ == "__main__":
    main()
