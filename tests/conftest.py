"""Shared fixtures: a real nats-server on a free port for the whole session; the
Mooncake transfer engine's availability."""

from __future__ import annotations

import os
import uuid
from contextlib import contextmanager

import pytest

from radixmesh.natsd import NatsServer


@pytest.fixture(scope="session", autouse=True)
def _test_process_on_one_thread():
    """The stacks and servers tests start use the cores; the test process's own torch work
    (references, small models) keeps to one thread, so its OpenMP threads never spin against
    them. A fixture that runs where nothing else does may take more (``all_threads``)."""
    import torch

    torch.set_num_threads(1)


@contextmanager
def all_threads():
    """Every core for the test process's torch work meanwhile: for references computed
    before any stack starts (HF generate in fp32 is ~2x faster on two cores)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="session")
def nats_server():
    with NatsServer() as server:
        yield server


@pytest.fixture()
def subject_prefix() -> str:
    """A fresh subject namespace per test so tests never see each other's traffic."""
    return "t" + uuid.uuid4().hex[:10]


@pytest.fixture(scope="session")
def mooncake() -> None:
    """Skip a test when the Mooncake transfer engine cannot be imported here (the
    optional extra), with the reason; under CI=true that fails it instead."""
    from libs.transfer.mooncake import unavailable

    reason = unavailable()
    if reason and os.environ.get("CI") == "true":
        pytest.fail(f"CI=true: {reason}")
    if reason:
        pytest.skip(reason)
