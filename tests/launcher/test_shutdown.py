"""Stopping cleanly: Bus.close with the broker gone, nats-server's files."""

from __future__ import annotations

import asyncio

from libs.protocol import Bus
from libs.protocol.messages import Ping
from radixmesh.natsd import NatsServer


async def test_bus_close_does_not_raise_while_the_broker_is_gone(tmp_path):
    # what a service does at Ctrl-C when nats-server went down first: a last publish
    # is buffered while reconnecting, then close; drain refuses (reconnecting) and
    # nats-py's close hits the dead socket flushing that buffer
    server = NatsServer(log_file=tmp_path / "nats.log").start()
    bus = await Bus.connect(server.url, "closing")
    try:
        await bus.subscribe("t.x", lambda _: asyncio.sleep(0), Ping)
        server.proc.kill()
        server.proc.wait()
        while bus.nc.is_connected:
            await asyncio.sleep(0.02)
        await bus.publish("t.x", Ping())
        assert bus.nc._pending_data_size > 0  # NOTE: the case that used to raise
        await bus.close()
        assert bus.nc.is_closed
        await bus.close()  # twice is fine
    finally:
        server.stop()


def test_nats_server_log_is_per_run_and_its_config_goes_with_it(tmp_path):
    log = tmp_path / "nats-server.log"
    log.write_text("A LINE OF AN EARLIER RUN\n")
    server = NatsServer(log_file=log).start()
    try:
        assert server.config_file.exists() and oct(server.config_file.stat().st_mode)[-3:] == "600"
        server.proc.kill()
        server.proc.wait()
        server.start()  # a restart appends
        server.stop()
        assert not server.config_file.exists()
        text = log.read_text()
        assert "EARLIER RUN" not in text and text.count("Server is ready") == 2
    finally:
        server.stop()
