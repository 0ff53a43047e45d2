"""`radixmesh up --prefill-workers 1 --decode-workers 1` as a user runs it (the real
command in a subprocess, the real default model in fp32, its own nats-server), every
prompt sent to the prefill worker (`--remote-prefill-min-tokens 0`). A greedy request
is decoded by the decode worker from KV the prefill worker computed and pushed (bytes in
the gateway's /metrics), with the output the decode worker gives when it prefills the
prompt itself (a request with logprobs is never handed to a prefill worker). `kill -9`
of the prefill worker while prompts are on it costs no request: the decode worker
prefills them itself, with identical output; the launcher restarts the prefill worker
and KV moves again. Ctrl-C exits 0.

The tests run in file order on one stack."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time

import httpx
import pytest

from .up_process import MODEL, Chat, Up, chat, gone, health_until, serving

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ARGS = ["--prefill-workers", "1", "--decode-workers", "1", "--threads", "1", "--dtype", "float32",
        "--kv-slots", "4096", "--remote-prefill-min-tokens", "0", "--local-prefill-factor", "0"]
TOPICS = ("lighthouse", "orchard", "harbor", "glacier", "library", "foundry", "vineyard", "observatory")


def document(topic: str, sentences: int = 24) -> str:
    """A prompt of ~15 tokens a sentence, distinct from its first words."""
    body = " ".join(f"Note {k} on the {topic}: its keepers record the weather at hour {k}."
                    for k in range(sentences))
    return f"About the {topic}. {body} Summarize the notes on the {topic} in one sentence."


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    yield from serving(tmp_path_factory.mktemp("up_pd"), ARGS, workers=2)


def workers(up: Up) -> dict[str, tuple[str, int]]:
    """role letter ("p", "d") -> (worker id, pid), from the launcher's children."""
    found = {}
    for name, pid in up.children().items():
        if name.startswith("gpu_worker:"):
            wid = name.split(":", 1)[1]
            found[wid[0]] = (wid, pid)
    return found


async def transfers(client: httpx.AsyncClient) -> tuple[float, float]:
    """(KV bytes received by decode workers, transfers given up), from the gateway's /metrics."""
    text = (await client.get("/metrics")).text

    def total(name: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name + "{"))

    return total("radixmesh:kv_transfer_bytes"), total("radixmesh:kv_transfer_failures")


async def busy(client: httpx.AsyncClient, worker: str, limit: float = 60.0) -> None:
    """Until the gateway's /metrics shows requests running or queued on ``worker``."""
    deadline = time.monotonic() + limit
    pattern = re.compile(rf'^sglang:num_(running|queue)_reqs{{.*worker="{worker}".*}} (\S+)$', re.M)
    while not any(float(v) > 0 for _, v in pattern.findall((await client.get("/metrics")).text)):
        assert time.monotonic() < deadline, f"nothing reached {worker} within {limit}s"
        await asyncio.sleep(0.05)


async def reference(client: httpx.AsyncClient, question: str, max_tokens: int) -> Chat:
    """The decode worker's own output: a request with logprobs is prefilled where it decodes."""
    before = await transfers(client)
    resp = await client.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": question}], "temperature": 0,
        "max_tokens": max_tokens, "logprobs": True})  # NOTE: not streamed: logprobs are not
    assert resp.status_code == 200, resp.text
    assert await transfers(client) == before  # nothing moved for it
    (choice,) = resp.json()["choices"]
    return Chat(status=200, worker=resp.headers["x-radixmesh-worker"],
                text=choice["message"]["content"], finishes=[choice["finish_reason"]])


async def test_a_request_is_decoded_from_kv_the_prefill_worker_pushed(up):
    decode_id = workers(up)["d"][0]
    question = document(TOPICS[0])
    async with httpx.AsyncClient(base_url=up.url, timeout=180) as client:
        before, failed = await transfers(client)
        got = await chat(client, question, max_tokens=16)
        after, failed_after = await transfers(client)
        want = await reference(client, question, 16)
    assert got.status == 200 and not got.errors and got.worker == decode_id, got
    assert after > before and failed_after == failed  # its KV came from the prefill worker
    assert got.text == want.text and got.finishes == want.finishes
    print(f"\n{after - before:.0f} bytes of KV moved for one {len(question)}-character prompt")


async def test_a_killed_prefill_worker_costs_no_request_and_is_restarted(up):
    (prefill_id, victim), (decode_id, _) = workers(up)["p"], workers(up)["d"]
    questions = [document(t) for t in TOPICS[1:5]]
    async with httpx.AsyncClient(base_url=up.url, timeout=180) as client:
        _, failed = await transfers(client)
        tasks = [asyncio.create_task(chat(client, q, max_tokens=8)) for q in questions]
        await busy(client, prefill_id)  # ~1,500 prompt tokens queued there: seconds of prefill
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        got = await asyncio.gather(*tasks)
        finished_s = time.monotonic() - killed
        _, failed_after = await transfers(client)
        want = [await reference(client, q, 8) for q in questions]
        line = up.wait_for_output(r"radixmesh: gpu_worker-0 was killed by SIGKILL; restarted as "
                                  r"pid (\d+)", 15)
        assert workers(up)["p"] == (prefill_id, int(line.group(1)))  # the same id, a new process
        # NOTE: its model loads in ~10 s on a quiet machine, a minute on a busy one
        assert (await health_until(client, "ok", 180))["workers"] == 2
        bytes_before, _ = await transfers(client)
        deadline = time.monotonic() + 30
        for topic in TOPICS[5:] * 10:  # the index has seen it: KV moves again
            again = await chat(client, document(topic, 16), max_tokens=4)
            assert again.status == 200 and not again.errors and again.worker == decode_id, again
            if (await transfers(client))[0] > bytes_before:
                break
            assert time.monotonic() < deadline, "no KV transfer after the prefill worker's restart"
        serving_s = time.monotonic() - killed
    for ref, out in zip(want, got):
        assert out.status == 200 and not out.errors and out.worker == decode_id, out
        assert out.text == ref.text and out.finishes == ref.finishes  # prefilled here: same tokens
    assert failed_after > failed  # at least one prompt was on the prefill worker when it died
    print(f"\nprefill worker kill: {failed_after - failed:.0f} of 4 prompts prefilled by the decode "
          f"worker, all done {finished_s:.1f}s after the kill; KV moved again {serving_s:.1f}s after it")


def test_ctrl_c_stops_the_stack_and_exits_0(up):
    children = up.children()
    assert sum(name.startswith("gpu_worker:") for name in children) == 2
    assert up.ctrl_c() == 0, up.output()
    output = up.output()
    assert "Traceback" not in output
    stopping = output.index("radixmesh: stopping")
    assert not re.search(r"restarted|while stopping", output[stopping:]), output
    assert all(gone(pid) for pid in children.values()), children
