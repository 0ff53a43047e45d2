"""``radixmesh up --kv-store mooncake`` starts a master only where the workers are given none."""

from __future__ import annotations

from radixmesh.store_up import wants_master


def test_a_master_is_started_only_for_mooncake_without_an_address():
    assert wants_master(["--host-kv-slots", "64", "--kv-store", "mooncake"])
    assert wants_master(["--kv-store=mooncake"])
    assert not wants_master(["--kv-store", "mooncake", "--kv-store-url", "10.0.0.5:50051"])
    assert not wants_master(["--kv-store", "mooncake", "--kv-store-url=10.0.0.5:50051"])
    assert not wants_master(["--kv-store", "nats"]) and not wants_master([])
    assert not wants_master(["--kv-store", "mooncake", "--kv-store", "nats"])  # the last one counts
