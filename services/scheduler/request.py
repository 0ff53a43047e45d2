"""A request as the scheduler tracks it."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field

import numpy as np

from libs.protocol.messages import ErrorInfo, SamplingParams


@dataclass
class Req:
    rid: str
    input_ids: list[int]
    sampling: SamplingParams
    detok_instance: str
    seed: int = field(default_factory=lambda: secrets.randbits(63))
    output_ids: list[int] = field(default_factory=list)
    row: int = -1
    kv_len: int = 0  # tokens whose K/V are in the pool
    slots: list[np.ndarray] = field(default_factory=list)
    cached_tokens: int = 0
    finish_reason: str | None = None
    error: ErrorInfo | None = None
    aborted: bool = False
    t_enqueue: float = field(default_factory=time.monotonic)
    t_admit: float = 0.0

    def __post_init__(self) -> None:
        if self.sampling.seed is not None:
            self.seed = self.sampling.seed & ((1 << 63) - 1)

    @property
    def prompt_len(self) -> int:
        return len(self.input_ids)

    @property
    def max_total_len(self) -> int:
        """KV slots this request can ever need (prompt + every output but the last)."""
        return self.prompt_len + self.sampling.max_new_tokens

    @property
    def remaining_tokens(self) -> int:
        return self.sampling.max_new_tokens - len(self.output_ids)

    def all_slots(self) -> np.ndarray:
        if not self.slots:
            return np.empty(0, dtype=np.int64)
        return np.concatenate(self.slots)
