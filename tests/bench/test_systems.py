import pytest

from radixmesh.bench.systems import BenchError, HOST_TIER_RATIO, RunResult, pd_split, plan_systems, run_stack
from radixmesh.bench.transfers import Transfers


def recording_stack(configs: list) -> type:
    """A LocalStack stand-in that records the configs it is started with (the plan is
    under test here, not the stack)."""

    class FakeStack:
        url, nats_url = "http://127.0.0.1:1", "nats://127.0.0.1:1"

        def __init__(self, config, progress):
            configs.append(config)

        def start(self, timeout):
            pass

        def stop(self):
            pass

    return FakeStack


def test_host_tier_system_starts_its_own_stack_with_a_host_pool():
    plan = plan_systems(["radixmesh", "radixmesh-host-tier"], url=None)
    tiered = plan.systems[1]
    assert (tiered.kind, tiered.host_ratio) == ("stack", HOST_TIER_RATIO) and HOST_TIER_RATIO > 1
    assert plan.systems[0].host_ratio == 0
    remote = plan_systems(["radixmesh-host-tier"], url="http://127.0.0.1:1")
    assert not remote.systems and "needs a stack" in remote.notes[0]


def test_store_tier_system_adds_the_store_and_warms_it_before_the_run(monkeypatch, tmp_path):
    import radixmesh.launcher as launcher
    from radixmesh.bench import systems

    plan = plan_systems(["radixmesh-store-tier"], url=None)
    [tier] = plan.systems
    assert (tier.host_ratio, tier.store) == (HOST_TIER_RATIO, True) and "restarted empty" in plan.notes[0]
    configs, calls = [], []

    FakeStack = recording_stack(configs)

    async def fake_bench(url, system, counters, prepare, workload, **kw):
        await prepare("the stream")
        return RunResult([], 1.0, 0.0)

    async def fake_warm(stack, stream, workload, limit_s):
        calls.append((type(stack), stream, workload, limit_s))

    monkeypatch.setattr(launcher, "LocalStack", FakeStack)
    monkeypatch.setattr(systems, "bench_http", fake_bench)
    monkeypatch.setattr(systems, "warm_store", fake_warm)
    stack = dict(model="default", workers=1, dtype="float32", kv_slots=1024, threads_per_worker=1)
    run_stack(tier, stack, tmp_path, 10.0, workload="the workload")
    [cfg] = configs
    assert cfg.extra["gpu_worker"] == ["--host-kv-slots", "3072", "--kv-store", "nats"]
    assert calls == [(FakeStack, "the stream", "the workload", 10.0)]


def test_pd_system_splits_the_same_workers_into_prefill_and_decode():
    plan = plan_systems(["radixmesh", "radixmesh-pd"], url=None, workers=2)
    base, pd = plan.systems
    assert (base.layout(2), pd.layout(2)) == ("2 colocated", "1 prefill + 1 decode")
    assert dict(pd.stack) == {"workers": 0, "prefill_workers": 1, "decode_workers": 1}
    assert dict(pd_split(3)) == {"workers": 0, "prefill_workers": 1, "decode_workers": 2}
    for url, workers in ((None, 1), ("http://127.0.0.1:1", 2)):
        skipped = plan_systems(["radixmesh-pd"], url=url, workers=workers)
        assert not skipped.systems and "radixmesh-pd skipped" in skipped.notes[0]


def test_pd_system_with_given_prefill_and_decode_counts():
    [pd] = plan_systems(["radixmesh-pd-2p1d"], url=None, workers=2).systems
    assert (pd.kind, pd.layout(2)) == ("stack", "2 prefill + 1 decode")
    assert dict(pd.stack) == {"workers": 0, "prefill_workers": 2, "decode_workers": 1}
    remote = plan_systems(["radixmesh-pd-2p1d"], url="http://127.0.0.1:1")
    assert not remote.systems and "needs a stack" in remote.notes[0]
    for bad in ("radixmesh-pd-0p1d", "radixmesh-pd-2p", "radixmesh-pd-2p0d"):
        with pytest.raises(BenchError, match="radixmesh-pd-<P>p<D>d"):
            plan_systems([bad], url=None, workers=2)


def test_run_stack_starts_the_pd_layout_and_reads_its_transfers(monkeypatch, tmp_path):
    import radixmesh.launcher as launcher
    from radixmesh.bench import systems

    configs = []

    FakeStack = recording_stack(configs)

    async def fake_bench(url, system, counters, **kw):
        return RunResult([], 1.5, 0.0, await counters())

    async def fake_counters(nats_url, prefix):
        return Transfers(sent=4) if (nats_url, prefix) == (FakeStack.nats_url, "tpd") else None

    monkeypatch.setattr(launcher, "LocalStack", FakeStack)
    monkeypatch.setattr(systems, "bench_http", fake_bench)
    monkeypatch.setattr(systems, "read_counters", fake_counters)
    [pd] = plan_systems(["radixmesh-pd"], url=None, workers=2).systems
    stack = dict(model="default", workers=2, dtype="float32", kv_slots=1024, threads_per_worker=1,
                 subject_prefix="tpd")
    result = run_stack(pd, stack, tmp_path, 10.0)
    [cfg] = configs
    assert (cfg.workers, cfg.prefill_workers, cfg.decode_workers, cfg.threads_per_worker) == (0, 1, 1, 1)
    assert result == RunResult([], 1.5, 0.0, Transfers(sent=4))


def test_index_replica_systems_parse_into_stacks_of_n_replicas():
    plan = plan_systems(["radixmesh", "radixmesh-index2", "radixmesh-index3-kill"], url=None, workers=4)
    base, two, three = plan.systems
    assert (base.stack, base.kill) == ((), "")
    assert (two.kind, dict(two.stack), two.kill) == ("stack", {"index_replicas": 2}, "")
    assert (dict(three.stack), three.kill) == ({"index_replicas": 3}, "cache_index-1")
    assert two.layout(4) == "4 colocated" and "SIGKILLed" in plan.notes[0]
    remote = plan_systems(["radixmesh-index2"], url="http://127.0.0.1:1")
    assert not remote.systems and "needs a stack" in remote.notes[0]
    for bad in ("radixmesh-index0", "radixmesh-index1-kill", "radixmesh-index2-killed", "radixmesh-indexx"):
        with pytest.raises(BenchError, match="radixmesh-index<N>"):
            plan_systems([bad], url=None)


def test_kill_system_kills_the_replica_once_half_the_requests_were_sent(monkeypatch, tmp_path):
    import radixmesh.launcher as launcher
    from radixmesh.bench import systems

    configs, killed = [], []
    FakeStack = recording_stack(configs)
    FakeStack.kill = lambda self, name: killed.append(name) or 123

    class FakeWorkload:
        requests = [object()] * 5

    async def fake_bench(url, system, counters, prepare, on_send, workload, **kw):
        for n in range(1, 6):
            on_send(n)
            if n < 3:
                assert not killed
        return RunResult([], 1.0, 0.0)

    monkeypatch.setattr(launcher, "LocalStack", FakeStack)
    monkeypatch.setattr(systems, "bench_http", fake_bench)
    [kill] = plan_systems(["radixmesh-index2-kill"], url=None, workers=4).systems
    stack = dict(model="default", workers=4, dtype="float32", kv_slots=1024, threads_per_worker=1)
    run_stack(kill, stack, tmp_path, 10.0, workload=FakeWorkload())
    [cfg] = configs
    assert (cfg.index_replicas, cfg.workers, killed) == (2, 4, ["cache_index-1"])
