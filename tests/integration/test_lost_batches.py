"""Token batches lost on the way (``RADIXMESH_FAULT_DROP``: the tokenizer loses some of the
scheduler's batches, the gateway some of the tokenizer's, as when a broker node dies
mid-delivery): every stream still ends with the same text as an undisturbed stack's, with
no gap and no repeat, each with one final event."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from radixmesh.launcher import LocalStack, ephemeral_stack_config

from .test_faults import stream

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPTS = [f"Letter {i}: dear friend, the weather in the mountains this week" for i in range(8)]
TOKENS = 32


@pytest.fixture(scope="module")
def lossy(tmp_path_factory):
    config = ephemeral_stack_config(tmp_path_factory.mktemp("lossy"), workers=1, dtype="float32")
    p = config.subject_prefix
    config.env["RADIXMESH_FAULT_DROP"] = f"{p}.tokenizer.detok.*@4:12:20:33,{p}.gw.*.out@7:18"
    with LocalStack(config, progress=lambda m: None) as running:
        yield running


async def test_lost_token_batches_leave_no_gap_and_no_repeat(stack, lossy):
    async with httpx.AsyncClient(base_url=stack.url, timeout=180) as client:
        reference = await asyncio.gather(*(stream(client, p, TOKENS) for p in PROMPTS))
    async with httpx.AsyncClient(base_url=lossy.url, timeout=180) as client:
        got = await asyncio.gather(*(stream(client, p, TOKENS) for p in PROMPTS))
    logs = {name: (lossy.config.log_dir / f"{name}.log").read_text() for name in ("tokenizer", "gateway")}
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
