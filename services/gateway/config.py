"""How the gateway's request path waits and retries (the pipeline and its placement read it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PipelineConfig:
    request_timeout: float = 600.0  # longest silence between two deltas
    bus_timeout: float = 10.0  # encode / route replies
    # a submit is an in-memory enqueue: a scheduler silent this long died holding it
    submit_timeout: float = 2.0
    submit_attempts: int = 3  # an unanswered submit launches again under a fresh bus rid
    route_attempts: int = 3  # submit refused with 503 -> route again, excluding that worker
    route_timeout: float = 2.0  # a route unanswered this long is asked again (index_attempts) ...
    index_attempts: int = 2  # ... (an index replica died holding it), then the own load view routes
    watch_interval: float = 0.25  # how often open requests are checked for a lost scheduler
    stall_s: float = 3.0  # output quiet this long: ask the scheduler; still short this much later: lost
    stall_check_s: float = 1.0  # how often quiet requests are looked for
    resume_wait: float = 5.0  # a lost scheduler's requests wait this long for its successor
    tokenizer_probe_interval: float = 1.0  # how often tokenizers are pinged while requests run
    tokenizer_wait: float = 30.0  # a lost tokenizer's requests wait this long for another
    broker_wait: float = 30.0  # requests cut by a broker blip wait this long for the bus to return
    # a new request finding no routable worker waits this long where workers reported lately
    # (restarting, between schedulers: a rolling restart), else it gets 503 at once
    no_worker_wait: float = 10.0
