"""A request as the scheduler tracks it.

KV positions of a request, and who owns their slots::

    0 ........ tree_len ............ kv_len ........ len(fill)
    |  in the radix tree, locked    | the request's  | not computed yet
    |  through lock_node (slots may | own slots      | (prefill chunks
    |  be the request's duplicates, |                |  still to run)
    |  listed in dup_slots)         |                |

``fill`` is prompt + output so far: a retracted request resumes by prefilling
it again (mostly from the cache) and continues with the same output.

NOTE: ``kv_len`` counts positions whose K/V a step already SENT will write
(the worker runs steps in order, so a later step may read them). With the
overlap schedule, step N+1 is planned before N's result arrives: ``ahead``
counts tokens sampled by steps in flight and not yet in ``output_ids``, so a
decoding request has ``kv_len == fill_len - 1 + ahead``, and its next input is
the worker's own last sampled token for the row (-1 on the wire).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

import numpy as np

from libs.protocol.messages import ErrorInfo, Logprobs, SamplingParams


@dataclass(eq=False)
class Req:
    rid: str
    input_ids: list[int]
    sampling: SamplingParams
    detok_instance: str
    namespace: str = ""
    seed: int = field(default_factory=lambda: secrets.randbits(63))
    output_ids: list[int] = field(default_factory=list)
    row: int = -1
    kv_len: int = 0  # tokens whose K/V are in the pool
    slots: list[np.ndarray] = field(default_factory=list)  # slots of positions [0, kv_len)
    tree_len: int = 0
    lock_node: object | None = None
    dup_slots: list[np.ndarray] = field(default_factory=list)
    new_row: bool = False  # the worker has not seen this row's sampling state yet
    cached_tokens: int = 0
    finish_reason: str | None = None
    error: ErrorInfo | None = None
    aborted: bool = False
    retractions: int = 0
    # sampling.return_logprob: the next position of prompt + output whose logprob
    # is still to report (-1: none wanted), and those computed but not yet sent
    lp_next: int = -1
    lp_pending: Logprobs | None = None
    ahead: int = 0  # tokens sampled by steps in flight, not yet in output_ids
    end_ids: list[int] = field(default_factory=list)  # with sampling.regex: ids that may end it

    def __post_init__(self) -> None:
        if self.sampling.seed is not None:
            self.seed = self.sampling.seed & ((1 << 63) - 1)
        if self.sampling.return_logprob:
            start = self.sampling.logprob_start_len
            self.lp_next = len(self.input_ids) if start < 0 else min(start, len(self.input_ids))

    @property
    def prompt_len(self) -> int:
        return len(self.input_ids)

    @property
    def fill_len(self) -> int:
        return len(self.input_ids) + len(self.output_ids)

    def fill(self) -> list[int]:
        return self.input_ids + self.output_ids

    @property
    def decoding(self) -> bool:
        """Everything but the last sampled token is in KV: the next step decodes."""
        return bool(self.output_ids or self.ahead) and self.kv_len == self.fill_len - 1 + self.ahead

    def ends_in_flight(self, max_model_len: int) -> bool:
        """The tokens in flight reach max_new_tokens or the context length."""
        return bool(self.ahead) and (self.remaining_tokens <= self.ahead
                                     or self.fill_len + self.ahead >= max_model_len)

    @property
    def remaining_tokens(self) -> int:
        return self.sampling.max_new_tokens - len(self.output_ids)

    def all_slots(self) -> np.ndarray:
        if not self.slots:
            return np.empty(0, dtype=np.int64)
        if len(self.slots) > 1:
            self.slots = [np.concatenate(self.slots)]
        return self.slots[0]
