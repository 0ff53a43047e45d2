"""The local stack's broker has JetStream (the shared KV store's bucket lives there)."""

from __future__ import annotations

import nats

from radixmesh.natsd import NatsServer


async def test_a_broker_with_a_jetstream_dir_serves_jetstream(tmp_path):
    with NatsServer(jetstream_dir=tmp_path / "js") as server:
        assert "jetstream" in server.config_text()
        nc = await nats.connect(server.url)
        try:
            info = await nc.jetstream().account_info()
            assert info.limits is not None
        finally:
            await nc.close()
    assert (tmp_path / "js").is_dir()
    assert "jetstream" not in NatsServer().config_text()  # off unless asked for
