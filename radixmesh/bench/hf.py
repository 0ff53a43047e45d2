"""Baseline: HF transformers ``generate``, in-process, one request after another.

What a Python user does without a server. Same prompts (the same chat template
and ids), same greedy sampling and token budget, fp32. A streamer stamps every
generated token, so TTFT (the prefill plus the first token) and the gaps are
measured like the stack's; there is no queueing, so TTFT is the unloaded one.
Follow-ups embed this baseline's own answers.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from .record import Record
from .runner import NoProgress, Progress
from .tokens import ChatTokenizer
from .workload import Workload


class _TokenClock:
    """A generate() streamer that only records when each new token arrived."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:  # NOTE: generate() first puts the prompt ids
            self._prompt_seen = True
            return
        self.times.extend([time.perf_counter()] * value.numel())

    def end(self) -> None:
        pass


class HFBaseline:
    def __init__(self, model_dir: Path, tok: ChatTokenizer, temperature: float = 0.0,
                 ignore_eos: bool = False, seed: int = 0) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.tok = tok
        self.temperature = temperature
        self.ignore_eos = ignore_eos
        self.seed = seed

    def generate(self, messages: list[dict[str, str]], max_tokens: int, record: Record,
                 index: int = 0) -> None:
        ids = self.tok.prompt_ids(messages)
        record.client_prompt_tokens = record.prompt_tokens = len(ids)
        clock = _TokenClock()
        kwargs: dict = dict(max_new_tokens=max_tokens, streamer=clock,
                            pad_token_id=self.model.generation_config.eos_token_id)
        if self.temperature > 0:
            torch.manual_seed(self.seed * 100_003 + index)
            kwargs.update(do_sample=True, temperature=self.temperature, top_p=1.0, top_k=0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if self.ignore_eos:
            kwargs["min_new_tokens"] = max_tokens
        inputs = torch.tensor([ids])
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(inputs, attention_mask=torch.ones_like(inputs), **kwargs)
        end = time.perf_counter()
        new = out[0, len(ids):].tolist()
        record.e2e_s = end - t0
        record.ttft_s = clock.times[0] - t0 if clock.times else None
        record.itl_s = [b - a for a, b in zip(clock.times, clock.times[1:])]
        record.completion_tokens = record.stream_tokens = len(new)
        eos = self.model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos])
        record.finish_reason = "stop" if new and new[-1] in eos_ids else "length"
        record.text = self.tok.tokenizer.decode(new, skip_special_tokens=True)

    def run(self, workload: Workload, system: str = "hf-generate",
            limit: int | None = None, progress: Progress | None = None
            ) -> tuple[list[Record], float]:
        """Run the first ``limit`` requests in order (a prefix is closed under parents)."""
        progress = progress or NoProgress()
        progress.reset(len(workload.requests[:limit]))
        answers: dict[str, str] = {}
        records = []
        t0 = time.perf_counter()
        for index, spec in enumerate(workload.requests[:limit]):
            record = Record(system, spec.id, spec.kind, list(spec.depends_on))
            record.start_s = time.perf_counter() - t0
            self.generate(spec.render(answers), spec.max_tokens, record, index)
            answers[spec.id] = record.text
            records.append(record)
            progress.update(1)
        return records, time.perf_counter() - t0

    def warm_up(self) -> None:
        self.generate([{"role": "user", "content": "Hello"}], 2, Record("warmup", "w", "warmup"))
