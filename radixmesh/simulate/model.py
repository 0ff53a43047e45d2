"""Service-time model of one worker, calibrated from this repo's CPU worker.

A simulated step runs the decode batch (one token per decoding request) plus
up to ``chunk_tokens`` prefill tokens, like the real scheduler's mixed steps::

    step_s = decode_base_s + decode_per_seq_s * decodes + prefill_tokens / prefill_tps

Defaults were measured with SmolLM2-135M on 2 CPU cores: prefill ~660 tok/s,
a decode step 52 ms at batch 1 and ~190 ms at batch 32.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServiceModel:
    prefill_tps: float = 650.0  # prompt tokens per second (marginal)
    decode_base_s: float = 0.052  # fixed cost of a step
    decode_per_seq_s: float = 0.0043  # extra cost per decoding request
    chunk_tokens: int = 1024  # prefill tokens per step (scheduler's chunked_prefill_size)
    kv_slots: int = 16384  # KV cache tokens per worker
    page_size: int = 16
    max_running: int = 256  # requests a worker runs at once
    host_slots: int = 0  # host tier KV tokens per worker (0: no host tier)
    host_load_tps: float = 20_000.0  # tokens of KV copied to or from the host tier per second

    def __post_init__(self) -> None:
        if min(self.prefill_tps, self.decode_base_s + self.decode_per_seq_s) <= 0:
            raise ValueError("prefill rate and decode step time must be positive")
        if min(self.decode_base_s, self.decode_per_seq_s) < 0:
            raise ValueError("decode step costs cannot be negative")
        if min(self.chunk_tokens, self.kv_slots, self.page_size, self.max_running) < 1:
            raise ValueError("chunk, kv slots, page size and max running must be >= 1")
        if self.host_slots < 0 or self.host_load_tps <= 0:
            raise ValueError("host slots must be >= 0 and the host copy rate positive")

    def step_s(self, decodes: int, prefill_tokens: int) -> float:
        return (self.decode_base_s + self.decode_per_seq_s * decodes
                + prefill_tokens / self.prefill_tps)

    def work_s(self, prefill_tokens: int, decode_tokens: int) -> float:
        """Worker-seconds of compute, with the fixed step cost amortised away
        (as in a large batch): the basis of the cluster's capacity."""
        return prefill_tokens / self.prefill_tps + decode_tokens * self.decode_per_seq_s
