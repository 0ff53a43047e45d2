"""What the KV data paths between workers share: their settings, their metrics and the
reasons a transfer fails (prefill/decode disaggregation; send.py pushes, recv.py
receives, service.py wires both onto the worker's data connection).

    path "shm"       one host (equal WorkerInfo.host_id): a file under /dev/shm + KVShmReady
    path "nats"      anywhere: KVChunk requests of <= 1 MB, several in flight
    path "mooncake"  only when asked (--kv-transfer mooncake): KVLand reserves a landing
                     buffer on the receiver, one Mooncake Transfer Engine write (TCP)
                     fills it, KVLand written has it checked; a receiver without an
                     engine answers mooncake_unavailable and the sender sends chunks
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import Counter, Histogram

TRANSFER_MODES = ("auto", "shm", "nats", "mooncake")
ROLES = ("both", "prefill", "decode")

# KVSendReply.error / KVChunkAck.error start with one of these (refused: "refused: <why>")
TIMEOUT, NO_ROUTE, CHECKSUM, REFUSED, DROPPED, SIZE = "timeout", "no_route", "checksum", "refused", "dropped", "size"
SHM_UNAVAILABLE = "shm_unavailable"  # the receiver cannot read the file: auto mode falls back to chunks
MOONCAKE_UNAVAILABLE = "mooncake_unavailable"  # the receiver runs no engine: the sender falls back to chunks
MOONCAKE = "mooncake"  # the engine's write failed (peer unreachable, address refused)

TRANSFER_BYTES = Counter("radixmesh:kv_transfer_bytes", "KV bytes moved between workers (prefill -> decode)",
                         ["path", "direction"])
TRANSFER_SECONDS = Histogram(
    "radixmesh:kv_transfer_seconds", "One KV transfer on the sending worker: export + push until staged",
    ["path"], buckets=(0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.0, 2.0, 5.0, 10.0),
)
TRANSFER_FAILURES = Counter("radixmesh:kv_transfer_failures", "KV transfers that failed, by reason", ["reason"])


@dataclass(frozen=True)
class KVTransferConfig:
    mode: str = "auto"  # auto: shm when the peer's host_id is ours and /dev/shm is writable, else nats
    mooncake_host: str = ""  # mode mooncake: the address peers reach this worker's engine at ("": resolved)
    max_chunk_bytes: int = 1 << 20  # capped by the broker's max_payload less CHUNK_OVERHEAD
    in_flight: int = 4  # chunk requests outstanding per transfer
    partial_idle_s: float = 30.0  # a partial transfer with no chunk for this long is dropped
    staged_ttl_s: float = 120.0  # a staged transfer never imported is freed after this
    remember_dropped: int = 4096  # dropped transfer ids kept (their late chunks are refused)
    reap_every_s: float = 5.0

    def __post_init__(self) -> None:
        if self.mode not in TRANSFER_MODES:
            raise ValueError(f"kv transfer mode must be one of {', '.join(TRANSFER_MODES)}, not {self.mode!r}")
        if self.max_chunk_bytes <= CHUNK_OVERHEAD or self.in_flight < 1:
            raise ValueError("max_chunk_bytes must exceed the chunk overhead and in_flight be >= 1")


# NOTE: a KVChunk's bytes beyond its data: msgpack fields + transfer id, NATS headers
# (trace context) and the subject; 4 KiB is far above what they take
CHUNK_OVERHEAD = 4096


def chunk_limit(config: KVTransferConfig, max_payload: int | None) -> int:
    """Data bytes per chunk: the configured size, within the broker's max_payload."""
    limit = config.max_chunk_bytes
    if max_payload:
        limit = min(limit, max_payload)
    return limit - CHUNK_OVERHEAD


def reason_of(error: str) -> str:
    """The metric label of an error string ("refused: no room" -> "refused")."""
    return error.split(":", 1)[0].strip() or "unknown"
