"""The stack's bf16 logits against HF transformers, position by position: ``python -m radixmesh.benchmarks.bf16_quality``.

Teacher-forced: each fixed prompt (quality_prompts.py) is followed by HF fp32's own greedy
continuation (up to ``--tokens`` tokens, to its EOS; generated in left-padded batches), and
every system is fed exactly those tokens; at each continuation position the next-token distributions are compared: top-1
agreement (the same argmax) and the mean KL(reference || system). HF bf16 against HF fp32 is
the yardstick: how far bf16 rounding alone moves a correct implementation.

The stack is the worker's ModelRunner as served (the default attention backend, the C++
kernels as loaded, weights packed as the worker packs them), fed as a served request is:
``stack`` rows prefill the prompt in one step, then decode the continuation one token per
step, a batch of prompts at a time; the ``one prefill`` row computes prompt + continuation in
a single extend step (the positions a resumed or cache-missed request recomputes).
"""

from __future__ import annotations

import argparse
import platform
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from libs.kernels import cpu_ext
from libs.models import resolve_model
from libs.protocol.messages import ForwardBatch, NewRow
from services.gpu_worker.model_runner import ModelRunner, RunnerConfig

from .quality_prompts import prompts

GROUP = 16  # prompts per stack batch
KV_SLOTS = 16384


@dataclass
class Case:
    kind: str  # chat | plain
    ids: list[int]  # the prompt's tokens
    cont: list[int]  # the fixed continuation (HF fp32 greedy)


@dataclass
class Score:
    agree: int = 0
    kl: float = 0.0
    positions: int = 0

    def add(self, ref: torch.Tensor, got: torch.Tensor) -> None:
        """Add the positions of ``ref`` / ``got`` ([positions, vocab] logits)."""
        ref_lp, got_lp = ref.double().log_softmax(-1), got.double().log_softmax(-1)
        self.agree += int((ref.argmax(-1) == got.argmax(-1)).sum())
        self.kl += float((ref_lp.exp() * (ref_lp - got_lp)).sum(-1).clamp_min(0).sum())
        self.positions += ref.shape[0]

    @property
    def top1(self) -> float:
        return self.agree / max(self.positions, 1)

    @property
    def mean_kl(self) -> float:
        return self.kl / max(self.positions, 1)


# (label, system, reference): what the table compares
ROWS = [
    ("stack bf16 vs HF fp32", "stack bf16", "hf fp32"),
    ("stack bf16, one prefill vs HF fp32", "stack bf16 prefill", "hf fp32"),
    ("HF bf16 vs HF fp32 (the yardstick)", "hf bf16", "hf fp32"),
    ("stack bf16 vs HF bf16", "stack bf16", "hf bf16"),
    ("stack fp32 vs HF fp32", "stack fp32", "hf fp32"),
]


def encode(tok, kind: str, prompt) -> list[int]:
    if kind == "plain":
        return list(tok(prompt).input_ids)
    out = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False)
    return list(out["input_ids"] if isinstance(out, dict) else out)


def make_cases(hf32, tok, tokens: int, which: list[int] | None = None) -> list[Case]:
    """The prompts (those at ``which``: all by default), each with HF fp32's greedy
    continuation (cut after its first EOS), generated a group at a time, left-padded."""
    eos = set(np.atleast_1d(hf32.generation_config.eos_token_id or tok.eos_token_id).tolist())
    every = prompts()
    chosen = every if which is None else [every[i] for i in which]
    encoded = [(kind, encode(tok, kind, prompt)) for kind, prompt in chosen]
    tok.padding_side = "left"
    cases = []
    for g in range(0, len(encoded), GROUP):
        group = encoded[g:g + GROUP]
        batch = tok.pad({"input_ids": [ids for _, ids in group]}, return_tensors="pt")
        out = hf32.generate(**batch, max_new_tokens=tokens, do_sample=False, pad_token_id=tok.eos_token_id)
        for (kind, ids), row in zip(group, out[:, batch["input_ids"].shape[1]:].tolist()):
            end = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
            cases.append(Case(kind, ids, row[:end]))
    return cases


@torch.inference_mode()
def hf_logits(model, case: Case) -> torch.Tensor:
    """[len(cont), vocab]: the logits that predict each continuation token, in one forward."""
    seq = torch.tensor([case.ids + case.cont[:-1]])
    return model(seq).logits[0, len(case.ids) - 1:].float()


def _new_rows(n: int) -> list[NewRow]:
    return [NewRow(row=r, temperature=0.0, top_p=1.0, top_k=-1, seed=0) for r in range(n)]


def stack_decode_logits(runner: ModelRunner, group: list[Case]) -> list[torch.Tensor]:
    """Prefill every prompt of ``group`` in one step, then feed the continuations one token a
    step (a row leaves the batch at its continuation's end); logits as :func:`hf_logits`."""
    base = np.cumsum([0] + [len(c.ids) + len(c.cont) for c in group])
    out: list[list[torch.Tensor]] = [[] for _ in group]
    first = runner.logits(ForwardBatch(
        step=0, new_rows=_new_rows(len(group)), rows=list(range(len(group))), prefix_lens=[0] * len(group),
        extend_lens=[len(c.ids) for c in group], input_ids=[t for c in group for t in c.ids],
        out_slots=[s for i, c in enumerate(group) for s in range(base[i], base[i] + len(c.ids))]))
    for i in range(len(group)):
        out[i].append(first[i])
    for k in range(max(len(c.cont) for c in group) - 1):
        rows = [i for i, c in enumerate(group) if k + 1 < len(c.cont)]
        logits = runner.logits(ForwardBatch(
            step=k + 1, new_rows=[], rows=rows, prefix_lens=[len(group[i].ids) + k for i in rows],
            extend_lens=[1] * len(rows), input_ids=[group[i].cont[k] for i in rows],
            out_slots=[int(base[i]) + len(group[i].ids) + k for i in rows]))
        for j, i in enumerate(rows):
            out[i].append(logits[j])
    return [torch.stack(rows) for rows in out]


def stack_prefill_logits(runner: ModelRunner, group: list[Case]) -> list[torch.Tensor]:
    """Prompt + continuation of every case of ``group`` in one extend step."""
    seqs = [c.ids + c.cont[:-1] for c in group]
    starts = np.cumsum([0] + [len(s) for s in seqs])
    at = np.concatenate([np.arange(starts[i] + len(c.ids) - 1, starts[i + 1]) for i, c in enumerate(group)])
    logits = runner.logits(ForwardBatch(
        step=0, new_rows=_new_rows(len(group)), rows=list(range(len(group))), prefix_lens=[0] * len(group),
        extend_lens=[len(s) for s in seqs], input_ids=[t for s in seqs for t in s],
        out_slots=list(range(int(starts[-1])))), at=at.astype(np.int64))[len(group):]
    return list(logits.split([len(c.cont) for c in group]))


def measure(model_dir: Path, cases: list[Case], hf32, hf16=None, stack_dir: Path | None = None,
            systems: tuple[str, ...] = ("stack bf16", "stack bf16 prefill", "hf bf16", "stack fp32"),
            kv_slots: int = KV_SLOTS) -> dict[str, Score]:
    """Scores of each row of :data:`ROWS` whose system is in ``systems`` (``stack_dir``: the
    stack serves that directory instead, e.g. a deliberately broken copy)."""
    feeds = {"stack bf16": ("bfloat16", stack_decode_logits), "stack bf16 prefill": ("bfloat16", stack_prefill_logits),
             "stack fp32": ("float32", stack_decode_logits)}
    runners = {dtype: ModelRunner(RunnerConfig(model=str(stack_dir or model_dir), dtype=dtype, kv_slots=kv_slots,
                                               max_requests=GROUP))
               for dtype in {feeds[s][0] for s in systems if s in feeds}}
    rows = [r for r in ROWS if r[1] in systems and (r[2] == "hf fp32" or "hf bf16" in systems)]
    scores = {label: Score() for label, _, _ in rows}
    for g in range(0, len(cases), GROUP):
        group = cases[g:g + GROUP]
        got = {"hf fp32": [hf_logits(hf32, c) for c in group]}
        if "hf bf16" in systems:
            got["hf bf16"] = [hf_logits(hf16, c) for c in group]
        for name in systems:
            if name in feeds:
                dtype, feed = feeds[name]
                got[name] = feed(runners[dtype], group)
        for label, system, ref in rows:
            for r, s in zip(got[ref], got[system]):
                scores[label].add(r, s)
    return scores


def cpu_name() -> str:
    """The CPU's model name and the flags the kernels' levels depend on."""
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    name = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")),
                platform.processor() or platform.machine())
    flags = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in cpu_ext.cpu_flags()]
    return f"{name} ({', '.join(flags) or 'none of avx2, avx512f, avx512_bf16, amx_bf16'})"


def table(scores: dict[str, Score], cases: list[Case]) -> str:
    chat = sum(c.kind == "chat" for c in cases)
    lines = [f"CPU: {cpu_name()}; kernels: {cpu_ext.describe()}; torch {torch.__version__}, {torch.get_num_threads()} threads",
             f"{len(cases)} prompts ({chat} chat, {len(cases) - chat} plain), "
             f"{sum(len(c.cont) for c in cases)} positions (HF fp32 greedy continuations, <= {max(len(c.cont) for c in cases)} tokens)",
             "", "| comparison | top-1 agreement | mean KL(reference ‖ system) |", "|---|---|---|"]
    lines += [f"| {label} | {s.top1 * 100:.2f}% | {s.mean_kl:.2e} |" for label, s in scores.items()]
    return "\n".join(lines)


def load_hf(model_dir: Path, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default")
    p.add_argument("--tokens", type=int, default=64, help="the continuation's length at most")
    p.add_argument("--prompts", type=int, default=None, help="the first N prompts only (default: all)")
    p.add_argument("--threads", type=int, default=0, help="torch's threads (0: its default)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    model_dir = resolve_model(args.model)
    hf32 = load_hf(model_dir, torch.float32)
    which = None if args.prompts is None else list(range(args.prompts))
    cases = make_cases(hf32, AutoTokenizer.from_pretrained(model_dir), args.tokens, which)
    scores = measure(model_dir, cases, hf32, load_hf(model_dir, torch.bfloat16))
    print(table(scores, cases))


if __name__ == "__main__":
    main()
