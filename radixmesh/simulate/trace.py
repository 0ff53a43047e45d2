"""Synthetic multi-document trace: every request is one document plus a question.

Documents share no tokens with each other (random ids); a request's prompt is
[system prefix] + document + question. Document popularity is Zipf-like and
arrivals are Poisson. Everything follows from ``seed``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .model import ServiceModel


@dataclass(frozen=True)
class TraceConfig:
    workers: int = 64
    requests: int = 0  # 0: 20 x workers
    docs: int = 0  # 0: 4 x workers
    doc_tokens: tuple[int, int] = (1000, 2000)  # inclusive range
    question_tokens: tuple[int, int] = (30, 50)
    system_tokens: int = 0  # shared by every request
    output_tokens: int = 64
    zipf: float = 1.1
    rate: float = 0.0  # requests/s; 0: ``utilisation`` x capacity under perfect caching
    utilisation: float = 0.7
    vocab: int = 49152
    seed: int = 0

    def __post_init__(self) -> None:
        if self.workers < 1 or self.requests < 0 or self.docs < 0:
            raise ValueError("workers must be >= 1; requests and docs >= 0 (0: default)")
        for name, (lo, hi) in (("doc_tokens", self.doc_tokens),
                               ("question_tokens", self.question_tokens)):
            if not 1 <= lo <= hi:
                raise ValueError(f"{name} must be a range 1 <= min <= max, got {(lo, hi)}")
        if self.system_tokens < 0 or self.output_tokens < 1:
            raise ValueError("system_tokens must be >= 0 and output_tokens >= 1")
        if self.zipf < 0 or self.rate < 0 or self.utilisation <= 0:
            raise ValueError("zipf and rate must be >= 0, utilisation > 0")

    @property
    def num_requests(self) -> int:
        return self.requests or 20 * self.workers

    @property
    def num_docs(self) -> int:
        return self.docs or 4 * self.workers


@dataclass
class Trace:
    config: TraceConfig
    system: np.ndarray
    docs: list[np.ndarray]
    doc_of: np.ndarray  # document of each request
    questions: list[np.ndarray]
    outputs: np.ndarray  # (requests, output_tokens) token ids the model "samples"
    arrivals: np.ndarray  # seconds, ascending
    rate: float

    def __len__(self) -> int:
        return len(self.doc_of)

    def prompt(self, i: int) -> np.ndarray:
        # NOTE: built on demand: documents are shared, never copied per request.
        return np.concatenate((self.system, self.docs[self.doc_of[i]], self.questions[i]))

    def prompt_len(self, i: int) -> int:
        return len(self.system) + len(self.docs[self.doc_of[i]]) + len(self.questions[i])

    def min_prefill_tokens(self) -> int:
        """Prompt tokens to compute with perfect caching: each document used once."""
        used = np.unique(self.doc_of)
        docs = sum(len(self.docs[d]) for d in used) + len(self.system)
        return int(docs + sum(len(q) for q in self.questions))


def make_trace(config: TraceConfig, model: ServiceModel) -> Trace:
    rng = lambda k: np.random.default_rng([config.seed, k])  # noqa: E731 - one stream per part
    n, d = config.num_requests, config.num_docs
    lo, hi = config.doc_tokens
    lengths = rng(0).integers(lo, hi + 1, d)
    token_rng = rng(1)
    docs = [token_rng.integers(0, config.vocab, n_tok, dtype=np.int64) for n_tok in lengths]
    system = rng(2).integers(0, config.vocab, config.system_tokens, dtype=np.int64)
    weights = 1.0 / np.arange(1, d + 1) ** config.zipf
    doc_of = rng(3).choice(d, size=n, p=weights / weights.sum())
    qlo, qhi = config.question_tokens
    q_rng = rng(4)
    questions = [q_rng.integers(0, config.vocab, q_rng.integers(qlo, qhi + 1), dtype=np.int64)
                 for _ in range(n)]
    outputs = rng(5).integers(0, config.vocab, (n, config.output_tokens), dtype=np.int64)
    trace = Trace(config, system, docs, doc_of, questions, outputs, np.empty(0), 0.0)
    trace.rate = config.rate or default_rate(trace, model)
    trace.arrivals = np.cumsum(rng(6).exponential(1.0 / trace.rate, n))
    longest = max(trace.prompt_len(i) for i in range(n)) + config.output_tokens
    if longest > model.kv_slots:
        raise ValueError(f"a request needs up to {longest} KV slots; workers have "
                         f"{model.kv_slots}: raise --kv-slots or shorten the documents")
    return trace


def default_rate(trace: Trace, model: ServiceModel) -> float:
    """Arrival rate that keeps the cluster ``utilisation`` busy if caching were
    perfect (every document prefilled once in the whole cluster)."""
    cfg = trace.config
    n = len(trace)
    work = model.work_s(trace.min_prefill_tokens(), n * (cfg.output_tokens - 1))
    return cfg.utilisation * cfg.workers * n / work
