from radixmesh.bench.systems import HOST_TIER_RATIO, plan_systems


def test_host_tier_system_starts_its_own_stack_with_a_host_pool():
    plan = plan_systems(["radixmesh", "radixmesh-host-tier"], url=None)
    tiered = plan.systems[1]
    assert (tiered.kind, tiered.host_ratio) == ("stack", HOST_TIER_RATIO) and HOST_TIER_RATIO > 1
    assert plan.systems[0].host_ratio == 0
    remote = plan_systems(["radixmesh-host-tier"], url="http://127.0.0.1:1")
    assert not remote.systems and "needs a stack" in remote.notes[0]
