"""A stack of two gateways on one port and two tokenizers (``radixmesh up --gateways 2
--tokenizers 2``) that loses token batches on the way (``RADIXMESH_FAULT_DROP``: tokenizers
lose some of the scheduler's batches, gateways some of the tokenizers', as when a broker
node dies mid-delivery): every stream still ends with the same text as an undisturbed
stack's, with no gap and no repeat; both gateways take a fair share of the connections
(SO_REUSEPORT) and both tokenizers encode (one queue group)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from libs.protocol import Bus, Subjects, codec
from libs.protocol.messages import Ping, Pong
from radixmesh.launcher import LocalStack, ephemeral_stack_config

from .test_faults import stream

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPTS = [f"Letter {i}: dear friend, the weather in the mountains this week" for i in range(8)]
TOKENS = 32


@pytest.fixture(scope="module")
def lossy(tmp_path_factory):
    config = ephemeral_stack_config(tmp_path_factory.mktemp("lossy"), workers=1, dtype="float32",
                                    gateways=2, tokenizers=2)
    p = config.subject_prefix
    config.env["RADIXMESH_FAULT_DROP"] = f"{p}.tokenizer.detok.*@4:12:20:33,{p}.gw.*.out@7:18"
    with LocalStack(config, progress=lambda m: None) as running:
        yield running


async def test_lost_token_batches_leave_no_gap_and_no_repeat(stack, lossy):
    async with httpx.AsyncClient(base_url=stack.url, timeout=180) as client:
        reference = await asyncio.gather(*(stream(client, p, TOKENS) for p in PROMPTS))
    async with httpx.AsyncClient(base_url=lossy.url, timeout=180) as client:
        got = await asyncio.gather(*(stream(client, p, TOKENS) for p in PROMPTS))
    logs = {name: "".join(p.read_text() for p in lossy.config.log_dir.glob(f"{name}*.log"))
            for name in ("tokenizer", "gateway")}
    dropped = {name: text.count("fault injection: dropped") for name, text in logs.items()}
    assert dropped["tokenizer"] >= 3 and dropped["gateway"] >= 1, dropped
    for ref, out in zip(reference, got):
        assert out.status == 200 and not out.errors, out.errors
        assert out.terminal_events == 1 and out.done == 1
        assert out.text == ref.text
        assert out.usage["completion_tokens"] == ref.usage["completion_tokens"]
    moved = logs["gateway"].count("moved from")
    print(f"\nlost batches: {dropped}; {moved} resumes; all {len(PROMPTS)} streams identical")
    assert moved >= 1


N = 40


async def _counts(stack: LocalStack, service: str, key: str) -> dict[str, int]:
    """instance -> the ``key`` counter every instance of ``service`` reports in its pong."""
    bus = await Bus.connect(stack.nats_url, "test-counts")
    got: dict[str, int] = {}
    try:
        async def on_reply(msg) -> None:
            pong = codec.decode(msg.data, Pong)
            got[pong.instance] = int(pong.detail.get(key, "0"))

        inbox = bus.nc.new_inbox()
        await bus.nc.subscribe(inbox, cb=on_reply)
        subject = Subjects(stack.config.subject_prefix).ping(service)
        await bus.nc.publish(subject, codec.encode(Ping()), reply=inbox)
        await asyncio.sleep(1.0)
    finally:
        await bus.close()
    return got


async def test_two_gateways_on_one_port_and_two_tokenizers_share_the_work(lossy):
    stack = lossy
    before = await _counts(stack, "gateway", "requests")
    body = {"model": "SmolLM2-135M-Instruct", "prompt": "The sea is", "max_tokens": 2, "temperature": 0}
    # NOTE: a new connection per request, as many clients make: the kernel picks a gateway per connection
    async with httpx.AsyncClient(base_url=stack.url, timeout=60,
                                 limits=httpx.Limits(max_keepalive_connections=0)) as client:
        replies = await asyncio.gather(*(client.post("/v1/completions", json=body) for _ in range(N)))
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies if r.status_code != 200]
    assert len({r.json()["choices"][0]["text"] for r in replies}) == 1
    gateways = await _counts(stack, "gateway", "requests")
    gateways = {k: v - before.get(k, 0) for k, v in gateways.items()}
    tokenizers = await _counts(stack, "tokenizer", "encoded")
    print(f"\nrequests per gateway {sorted(gateways.values())}, encodes per tokenizer {sorted(tokenizers.values())}")
    assert len(gateways) == 2 and sum(gateways.values()) == N
    assert min(gateways.values()) >= N // 5  # binomial(40, 1/2): below 8 about once in 10^5 runs
    assert len(tokenizers) == 2 and sum(tokenizers.values()) >= N and min(tokenizers.values()) >= N // 5
