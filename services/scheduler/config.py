"""Configuration of one worker's scheduler core."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CoreConfig:
    max_running_requests: int = 256
    max_queued_requests: int = 4096
    chunked_prefill_size: int = 1024
    schedule_policy: str = "fcfs"
    enable_cache: bool = True
    page_size: int = 1
    eviction_policy: str = "lru"
    init_new_token_ratio: float = 0.7
    min_new_token_ratio: float = 0.1
    new_token_ratio_decay: float = 0.002
    retract_interval: int = 0  # testing: retract one running request every N steps
    overlap: bool = True  # plan and send step N+1 while the worker runs step N
    host_write_policy: str = "write_back"  # host tier: when a device node is copied down
    # a decode worker prefills a prompt itself when fewer of its tokens than this are uncached
    # there (Dynamo's conditional disaggregation): a short prefill costs less than a round trip
    remote_prefill_min_tokens: int = 256
    # a request's tokens go to its tokenizer in groups of this many (its first token and its
    # finish at once): fewer messages per step for the tokenizer, gateway and clients
    stream_interval: int = 1
