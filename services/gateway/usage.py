"""A request's cached prompt tokens by tier: where they came from, adding up to cached_tokens."""

from __future__ import annotations

from libs.protocol.messages import Usage


def cached_by_tier(usage: Usage) -> dict:
    """Device memory, loaded back from host, or fetched from the shared store (L3) and
    loaded back; they add up to cached_tokens."""
    return {"device": usage.cached_tokens - usage.cached_host_tokens - usage.cached_store_tokens,
            "host": usage.cached_host_tokens, "store": usage.cached_store_tokens}


def prompt_only(usage: Usage) -> Usage:
    """A resumed request's cache hit may cover its replayed output too: cached tokens
    beyond the prompt are cut from its end (positions: device, then host, then store)."""
    cut = max(usage.cached_tokens - usage.prompt_tokens, 0)
    store = max(usage.cached_store_tokens - cut, 0)
    host = max(usage.cached_host_tokens - (cut - (usage.cached_store_tokens - store)), 0)
    return Usage(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens - cut, host, store)
