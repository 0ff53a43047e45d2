"""Shared fixtures: a real nats-server on a free port for the whole session; the
Mooncake transfer engine's availability."""

from __future__ import annotations

import os
import uuid

import pytest

from radixmesh.natsd import NatsServer


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
