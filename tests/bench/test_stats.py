import math

import pytest

from radixmesh.bench.record import Record
from radixmesh.bench.stats import percentile, summarize


def rec(system="s", ttft=0.1, e2e=1.0, completion=10, prompt=100, cached=0, error=None):
    return Record(system, "r", "question", ttft_s=ttft, e2e_s=e2e, completion_tokens=completion,
                  prompt_tokens=prompt, cached_tokens=cached, error=error,
                  itl_s=[(e2e - ttft) / max(completion - 1, 1)] * max(completion - 1, 0))


def test_percentile_interpolates_linearly():
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 50) == 2.5
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 4.0
    assert percentile(values, 90) == pytest.approx(3.7)
    assert percentile([5.0], 99) == 5.0
    assert math.isnan(percentile([], 50))


def test_tpot_excludes_the_first_token():
    assert rec(ttft=0.2, e2e=1.1, completion=10).tpot_s == pytest.approx(0.1)
    assert rec(completion=1).tpot_s is None  # no token after the first
    assert rec(error="boom").tpot_s is None


def test_summary_counts_only_successful_requests():
    records = [rec(ttft=0.1, e2e=1.0, completion=10, prompt=100, cached=50),
               rec(ttft=0.3, e2e=2.1, completion=10, prompt=300, cached=50),
               rec(error="HTTP 503", completion=0, prompt=0)]
    s = summarize("s", records, duration_s=4.0)
    assert (s.completed, s.failed) == (2, 1)
    assert s.request_throughput == 0.5
    assert s.output_throughput == 5.0 and s.input_throughput == 100.0
    assert s.ttft_p50_ms == pytest.approx(200.0)
    assert s.tpot_p50_ms == pytest.approx(150.0)  # 100 ms and 200 ms
    assert s.cache_hit_rate == 0.25
    assert s.completion_tokens == 20


def test_summary_of_nothing_is_nan_not_an_error():
    s = summarize("s", [], 0.0)
    assert s.completed == 0 and math.isnan(s.ttft_p50_ms) and math.isnan(s.cache_hit_rate)


def test_hit_rate_per_tier_is_a_share_of_the_prompt_tokens():
    a = rec(prompt=100, cached=80)
    a.cached_host_tokens, a.cached_store_tokens = 20, 50
    b = rec(prompt=100, cached=40)
    b.cached_host_tokens = 40
    s = summarize("s", [a, b], 1.0)
    assert (s.cache_hit_rate, s.host_hit_rate, s.store_hit_rate) == (0.6, 0.3, 0.25)
