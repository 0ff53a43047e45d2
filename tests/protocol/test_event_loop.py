"""The services' event loop: uvloop where installed, asyncio's on request."""

from __future__ import annotations

import asyncio

import pytest

from libs.protocol import event_loop


async def _loop_module() -> str:
    await asyncio.sleep(0)
    return type(asyncio.get_running_loop()).__module__


def test_auto_runs_on_uvloop_when_installed_and_asyncio_on_request(monkeypatch):
    pytest.importorskip("uvloop")
    monkeypatch.delenv(event_loop.ENV, raising=False)
    assert event_loop.run(_loop_module()).startswith("uvloop")
    assert event_loop.run(_loop_module(), "asyncio").startswith("asyncio")
    monkeypatch.setenv(event_loop.ENV, "asyncio")
    assert event_loop.run(_loop_module()).startswith("asyncio")


def test_a_bad_choice_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(event_loop.ENV, "trio")
    with pytest.raises(SystemExit, match="RADIXMESH_EVENT_LOOP='trio': expected one of auto, uvloop, asyncio"):
        event_loop.loop_factory()


def test_uvloop_asked_for_but_missing_is_a_clear_error(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_uvloop(name, *args, **kwargs):
        if name == "uvloop":
            raise ImportError("no uvloop here")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_uvloop)
    assert event_loop.loop_factory("auto") is None  # falls back to asyncio's loop
    with pytest.raises(SystemExit, match="uvloop is not installed"):
        event_loop.loop_factory("uvloop")
