"""A decode worker's measured KV transfer rates: what its transfer deadlines rest on.

Each completed transfer's report (``KVReady``: bytes, and the seconds the prefill
worker took to export and push them) updates an EMA of bytes/s for that prefill
worker and one over all of them; a peer not measured yet is assumed like the others,
and before any transfer the rate is ``DEFAULT_TRANSFER_BPS``. A transfer's predicted
seconds are its tokens' KV bytes (from the KV layout the workers announce) over it.
"""

from __future__ import annotations

import re

# NATS chunks (<= 1 MB, 4 in flight) between two processes on one host, the slowest path
# measured (0.63-0.67 GB/s; /dev/shm 1.3-1.9 GB/s): the path that always works
DEFAULT_TRANSFER_BPS = 0.6e9
FALLBACK_TOKEN_S = 1e-4  # per token, for a KV layout this cannot read
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_LAYOUT = re.compile(r"(\d+) layers x (\d+) KV heads x (\d+) dims, (\w+)")


def layout_token_bytes(layout: str) -> int:
    """One token's K and V bytes over all layers, from a layout as workers announce it
    (``libs.transfer.KVLayout.describe``: "30 layers x 3 KV heads x 64 dims, float32");
    0 if it cannot be read."""
    m = _LAYOUT.fullmatch(layout)
    if m is None or m[4] not in DTYPE_BYTES:
        return 0
    return 2 * int(m[1]) * int(m[2]) * int(m[3]) * DTYPE_BYTES[m[4]]


class TransferRates:
    def __init__(self, kv_layout: str) -> None:
        self.token_bytes = layout_token_bytes(kv_layout)
        self.by_peer: dict[str, float] = {}  # prefill worker -> bytes/s
        self.overall = 0.0  # bytes/s over every peer (0: nothing measured yet)

    def observe(self, peer: str, nbytes: int, seconds: float) -> None:
        if nbytes <= 0 or seconds <= 0:
            return
        rate = nbytes / seconds
        self.by_peer[peer] = _ema(self.by_peer.get(peer, 0.0), rate)
        self.overall = _ema(self.overall, rate)

    def bps(self, peer: str) -> float:
        return self.by_peer.get(peer) or self.overall or DEFAULT_TRANSFER_BPS

    def tokens_per_s(self) -> float:
        """Tokens of KV moved in per second over every peer (what the router credits)."""
        return 1.0 / self.seconds("", 1)

    def seconds(self, peer: str, tokens: int) -> float:
        """Predicted seconds to move ``tokens`` tokens of KV from ``peer``."""
        if not self.token_bytes:
            return tokens * FALLBACK_TOKEN_S
        return tokens * self.token_bytes / self.bps(peer)


def _ema(old: float, new: float) -> float:
    return new if not old else 0.8 * old + 0.2 * new
