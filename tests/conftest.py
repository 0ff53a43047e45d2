"""Shared fixtures: a real nats-server on a free port for the whole session."""

from __future__ import annotations

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
