"""One measured request, as stored in the JSON output, and its consistency checks."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Record:
    """Times are seconds; ``start_s`` is relative to the start of its system's run.

    ``itl_s`` holds one gap per output token after the first when
    ``per_token_gaps`` (tokens that arrived in one event get gap 0), else one
    gap per streamed chunk. ``server_ttft_s`` is the server's own TTFT for
    ``rid``; NOTE: it stays None until the gateway exposes it (the /metrics
    issue), and then the client/server agreement check in :func:`check` applies.
    """

    system: str
    id: str
    kind: str
    depends_on: list[str] = field(default_factory=list)
    rid: str | None = None
    start_s: float = 0.0
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    e2e_s: float | None = None
    prompt_tokens: int = 0  # usage.prompt_tokens
    cached_tokens: int = 0  # usage.prompt_tokens_details.cached_tokens
    cached_host_tokens: int = 0  # of those: loaded back from the host tier (cached_tokens_details)
    cached_store_tokens: int = 0  # of those: fetched from the shared store (L3)
    completion_tokens: int = 0  # usage.completion_tokens
    client_prompt_tokens: int = 0  # the rendered prompt, counted by the harness
    stream_tokens: int | None = None  # output tokens seen in the stream (None: not countable)
    per_token_gaps: bool = True
    finish_reason: str | None = None
    error: str | None = None
    worker: str | None = None  # the worker the router chose, when the server tells
    server_ttft_s: float | None = None
    text: str = ""
    cached_reported: bool = True  # False: the server's usage had no cached_tokens (unknown, not 0)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first: (e2e - ttft) / (completion - 1)."""
        if not self.ok or self.completion_tokens < 2 or self.ttft_s is None or self.e2e_s is None:
            return None
        return (self.e2e_s - self.ttft_s) / (self.completion_tokens - 1)


SERVER_TTFT_TOLERANCE_S = 0.010


def check(records: list[Record]) -> list[str]:
    """Problems with the harness's own numbers (empty when they are consistent)."""
    problems: list[str] = []
    for r in records:
        name = f"{r.system}/{r.id}"
        if not r.ok:
            continue
        if r.ttft_s is None or r.e2e_s is None or not 0 <= r.ttft_s <= r.e2e_s:
            problems.append(f"{name}: ttft {r.ttft_s} not within [0, e2e {r.e2e_s}]")
        if r.completion_tokens < 1:
            problems.append(f"{name}: finished without output tokens")
        if r.stream_tokens is not None and r.stream_tokens != r.completion_tokens:
            problems.append(f"{name}: {r.stream_tokens} tokens streamed, usage says "
                            f"{r.completion_tokens}")
        if r.per_token_gaps and len(r.itl_s) != max(r.completion_tokens - 1, 0):
            problems.append(f"{name}: {len(r.itl_s)} gaps for {r.completion_tokens} tokens")
        if r.client_prompt_tokens and r.prompt_tokens != r.client_prompt_tokens:
            problems.append(f"{name}: prompt has {r.client_prompt_tokens} tokens, usage says "
                            f"{r.prompt_tokens}")
        if not 0 <= r.cached_tokens <= r.prompt_tokens:
            problems.append(f"{name}: cached {r.cached_tokens} of {r.prompt_tokens} prompt tokens")
        if any(g < 0 for g in r.itl_s):
            problems.append(f"{name}: negative inter-token gap")
    problems += check_server_ttft(records)
    return problems


def check_server_ttft(records: list[Record]) -> list[str]:
    """Client vs server TTFT: the medians of the differences within 10 ms."""
    import numpy as np

    pairs = [(r.ttft_s, r.server_ttft_s) for r in records
             if r.ok and r.ttft_s is not None and r.server_ttft_s is not None]
    if not pairs:
        return []
    diff = float(np.median([c - s for c, s in pairs]))
    if abs(diff) > SERVER_TTFT_TOLERANCE_S:
        return [f"client TTFT exceeds the server's by {diff * 1000:.1f} ms (median); "
                f"allowed {SERVER_TTFT_TOLERANCE_S * 1000:.0f} ms"]
    return []
