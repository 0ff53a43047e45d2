"""Cached tokens per tier (device / host / store) in usage bodies and /metrics."""

from __future__ import annotations

import asyncio

from opentelemetry.trace import INVALID_SPAN
from prometheus_client import CollectorRegistry

from libs.protocol.messages import Usage
from services.gateway.formats import choices_usage, native_body, usage_body
from services.gateway.generation import Generation
from services.gateway.metrics import RequestMetrics
from services.gateway.usage import cached_by_tier, prompt_only

SPLIT = Usage(prompt_tokens=100, completion_tokens=5, cached_tokens=80, cached_host_tokens=16,
              cached_store_tokens=48)


def test_the_tiers_add_up_to_cached_tokens():
    assert cached_by_tier(SPLIT) == {"device": 16, "host": 16, "store": 48}
    details = usage_body(SPLIT)["prompt_tokens_details"]
    assert details["cached_tokens"] == sum(details["cached_tokens_details"].values()) == 80
    meta = native_body("r", "", [], "stop", SPLIT)["meta_info"]
    assert meta["cached_tokens_details"] == {"device": 16, "host": 16, "store": 48}


def test_an_old_sender_without_the_store_figure_counts_none():
    usage = Usage(prompt_tokens=10, completion_tokens=1, cached_tokens=8, cached_host_tokens=3)
    assert cached_by_tier(usage) == {"device": 5, "host": 3, "store": 0}


def test_choices_count_each_prompt_once_per_tier():
    other = Usage(prompt_tokens=50, completion_tokens=2, cached_tokens=32, cached_store_tokens=32)
    total = choices_usage([SPLIT, SPLIT, other, other], 2)
    assert cached_by_tier(total) == {"device": 16, "host": 16, "store": 80}
    assert total.cached_tokens == 112


def test_a_resumed_requests_hit_beyond_its_prompt_is_cut_from_the_end():
    # positions: device [0, 16), host [16, 32), store [32, 112); the prompt is 100 tokens
    resumed = Usage(prompt_tokens=100, completion_tokens=9, cached_tokens=112, cached_host_tokens=16,
                    cached_store_tokens=80)
    assert prompt_only(resumed) == Usage(100, 9, 100, 16, 68)
    deep = Usage(prompt_tokens=20, completion_tokens=9, cached_tokens=40, cached_host_tokens=16,
                 cached_store_tokens=8)  # the cut reaches into the host part
    assert cached_by_tier(prompt_only(deep)) == {"device": 16, "host": 4, "store": 0}
    assert prompt_only(SPLIT) == SPLIT


def test_metrics_count_hit_tokens_per_tier():
    registry = CollectorRegistry()
    metrics = RequestMetrics("m", registry)
    gen = Generation("r", "w", asyncio.Queue(), 100, INVALID_SPAN, 5.0, lambda g: None)
    gen.usage = SPLIT
    metrics.finished(gen)
    metrics.finished(gen)
    got = {tier: registry.get_sample_value("radixmesh:cached_tokens_by_tier_total",
                                           {"model_name": "m", "tier": tier})
           for tier in ("device", "host", "store")}
    assert got == {"device": 32.0, "host": 32.0, "store": 96.0}
    assert registry.get_sample_value("sglang:cached_tokens_total", {"model_name": "m"}) == 160.0
