"""A nats-server with JetStream (radixmesh.natsd starts one without): the store's tests
start and stop their own."""

from __future__ import annotations

import json
import shutil
import tempfile

from radixmesh.natsd import NatsServer


class JetStreamServer(NatsServer):
    """``NatsServer`` plus a JetStream block storing under a temporary directory (removed at
    :meth:`close`; a restart keeps the data)."""

    def __init__(self, **options) -> None:
        super().__init__(**options)
        self.store_dir = tempfile.mkdtemp(prefix="radixmesh-js-")

    def config_text(self) -> str:
        block = f"jetstream {{ store_dir: {json.dumps(self.store_dir)}, max_file_store: 1GB, max_memory_store: 64MB }}"
        return super().config_text() + block + "\n"

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.store_dir, ignore_errors=True)

    def __exit__(self, *exc) -> None:
        self.close()
