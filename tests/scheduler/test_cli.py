"""The scheduler's flags reach its configuration."""

from __future__ import annotations

from services.scheduler.__main__ import build_config, parse_args


def test_overlap_is_on_unless_disabled(monkeypatch):
    monkeypatch.delenv("RADIXMESH_DISABLE_OVERLAP_SCHEDULE", raising=False)
    assert build_config(parse_args([])).core.overlap
    assert not build_config(parse_args(["--disable-overlap-schedule"])).core.overlap
    monkeypatch.setenv("RADIXMESH_DISABLE_OVERLAP_SCHEDULE", "1")
    assert not build_config(parse_args([])).core.overlap


def test_batching_flags():
    cfg = build_config(parse_args(["--chunked-prefill-size", "64", "--schedule-policy", "lpm",
                                   "--disable-radix-cache", "--page-size", "4"])).core
    assert (cfg.chunked_prefill_size, cfg.schedule_policy, cfg.enable_cache, cfg.page_size) == (
        64, "lpm", False, 4)


def test_host_write_policy_flag_and_env(monkeypatch):
    assert build_config(parse_args([])).core.host_write_policy == "write_back"
    cfg = build_config(parse_args(["--host-write-policy", "write_through_selective"]))
    assert cfg.core.host_write_policy == "write_through_selective"
    monkeypatch.setenv("RADIXMESH_HOST_WRITE_POLICY", "write_through")
    assert build_config(parse_args([])).core.host_write_policy == "write_through"


def test_stream_interval_flag_env_and_bounds(monkeypatch):
    import pytest

    monkeypatch.delenv("RADIXMESH_STREAM_INTERVAL", raising=False)
    assert build_config(parse_args([])).core.stream_interval == 1
    assert build_config(parse_args(["--stream-interval", "4"])).core.stream_interval == 4
    monkeypatch.setenv("RADIXMESH_STREAM_INTERVAL", "2")
    assert build_config(parse_args([])).core.stream_interval == 2
    with pytest.raises(SystemExit):
        parse_args(["--stream-interval", "0"])
