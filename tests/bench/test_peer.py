"""Peers (``[LABEL:]openai=URL``): how they are named, and a peer nobody answers for."""

import argparse

import pytest

from radixmesh.bench import session
from radixmesh.bench.cli import add_arguments
from radixmesh.bench.errors import BenchError
from radixmesh.bench.record import Record
from radixmesh.bench.stats import summarize
from radixmesh.bench.systems import plan_systems
from radixmesh.natsd import free_port


def test_peers_are_planned_with_a_label_of_their_own_or_their_address():
    plan = plan_systems(["radixmesh", "openai=http://127.0.0.1:8100/", "vllm:openai=https://h.example/v1"],
                        url=None)
    assert [(s.name, s.kind, s.url) for s in plan.systems] == [
        ("radixmesh", "stack", ""), ("openai@127.0.0.1:8100", "peer", "http://127.0.0.1:8100"),
        ("vllm", "peer", "https://h.example/v1")]
    assert plan_systems(["openai=http://127.0.0.1:8100"], url="http://127.0.0.1:8000").systems[0].kind == "peer"


@pytest.mark.parametrize("bad, says", [
    ("openai=127.0.0.1:8100", r"want openai=http\(s\)://HOST"),
    ("openai=ftp://h:1", r"want openai=http\(s\)://HOST"),
    ("openai=http://", r"want openai=http\(s\)://HOST"),
    ("a b:openai=http://h:1", "must be letters, digits"),
    ("radixmesh:openai=http://h:1", "one of the harness's own systems"),
    ("radixmesh-pd-1p1d:openai=http://h:1", "used twice or taken"),
])
def test_bad_peers_are_refused_by_name(bad, says):
    with pytest.raises(BenchError, match=says):
        plan_systems([bad], url=None)


def test_two_peers_with_one_label_are_refused():
    with pytest.raises(BenchError, match="used twice"):
        plan_systems(["p:openai=http://a:1", "p:openai=http://b:1"], url=None)
    with pytest.raises(BenchError, match="used twice"):
        plan_systems(["openai=http://a:1", "openai=http://a:1"], url=None)
    with pytest.raises(BenchError, match=r"openai=URL"):
        plan_systems(["vllm=http://a:1"], url=None)  # unknown system: the message shows the syntax


def test_a_peer_without_cached_tokens_has_no_cache_hit_rate():
    reported = Record("p", "r", "q", ttft_s=0.1, e2e_s=0.2, prompt_tokens=10, completion_tokens=2)
    silent = Record("p", "r", "q", ttft_s=0.1, e2e_s=0.2, prompt_tokens=10, completion_tokens=2,
                    cached_reported=False)
    assert summarize("p", [reported], 1.0).cache_hit_rate == 0.0
    assert summarize("p", [silent], 1.0).cache_hit_rate != summarize("p", [silent], 1.0).cache_hit_rate


def test_an_unreachable_peer_stops_the_run_before_anything_runs(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(session, "_run_system", lambda plan, *rest: ran.append(plan.name))
    p = argparse.ArgumentParser()
    add_arguments(p)
    url = f"http://127.0.0.1:{free_port()}"
    args = p.parse_args(["--quick", "--workload", "random", "--systems", f"radixmesh,openai={url}",
                         "--no-plots", "--no-progress", "--output-dir", str(tmp_path / "out")])
    with pytest.raises(BenchError, match=rf"openai@127.0.0.1:\d+: no server answers at {url} \(ConnectError"):
        session.run_session(args)
    assert ran == [] and not (tmp_path / "out").exists()
