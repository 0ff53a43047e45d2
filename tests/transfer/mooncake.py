"""Mooncake Store for tests: skipped with the reason where the extra is not installed, except in
CI (CI=true), where scripts/install.sh installs it and a missing one is a failure."""

from __future__ import annotations

import os

import pytest

from libs.transfer import StoreNotInstalled


def mooncake_missing() -> str:
    """Why Mooncake Store cannot run here ("" when it can); under CI a missing one fails the test."""
    from libs.transfer.mooncake_master import master_binary
    from libs.transfer.mooncake_store import load_client_class

    try:
        load_client_class()
        master_binary()
    except StoreNotInstalled as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI installs Mooncake (scripts/install.sh): {exc}")
        return str(exc)
    return ""


def require_mooncake() -> None:
    if reason := mooncake_missing():
        pytest.skip(reason)


@pytest.fixture
def mooncake_master():
    """A mooncake_master on a free loopback port, stopped after the test."""
    from libs.transfer.mooncake_master import MooncakeMaster

    require_mooncake()
    with MooncakeMaster() as master:
        yield master
