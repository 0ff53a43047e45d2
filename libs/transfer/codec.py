"""Export slots of a KVPool to a :class:`KVBuffer` and import one into slots."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from libs.kernels import KVPool

from .buffer import HEADER_BYTES, KVBuffer, checksum, pack_header
from .errors import SlotError
from .layout import KVLayout
from .tokens import gather_tokens, scatter_tokens


def export_slots(pool: KVPool, slots: torch.Tensor) -> KVBuffer:
    """The K/V of ``slots`` ([T] int64, any device) as a sealed, host-resident buffer."""
    layout, payload = export_payload(pool, slots)
    return KVBuffer.seal(layout, len(slots), payload)


def export_payload(pool: KVPool, slots: torch.Tensor) -> tuple[KVLayout, memoryview]:
    """The K/V of ``slots`` as host bytes in token-major order, not checksummed (a data path
    that checksums as it sends: libs.transfer.chunks.iter_chunks)."""
    layout = KVLayout.of_pool(pool)
    data = gather_tokens(pool, _index(slots, pool)).cpu()
    return layout, _bytes_view(data).toreadonly()


def export_wire(pool: KVPool, slots: torch.Tensor) -> np.ndarray:
    """The sealed wire bytes (header + payload, as :meth:`KVBuffer.to_bytes`) of ``slots``,
    gathered straight into one new host array: a data path that writes them whole."""
    layout = KVLayout.of_pool(pool)
    index = _index(slots, pool)
    n = len(index)
    wire = np.empty(HEADER_BYTES + n * layout.token_bytes, dtype=np.uint8)
    if n:
        out = torch.from_numpy(wire[HEADER_BYTES:]).view(layout.torch_dtype).view(n, *layout.token_shape)
        gather_tokens(pool, index, out)
    crc = checksum(memoryview(wire)[HEADER_BYTES:])
    wire[:HEADER_BYTES] = np.frombuffer(pack_header(layout, n, n * layout.token_bytes, crc), dtype=np.uint8)
    return wire


def import_slots(pool: KVPool, slots: torch.Tensor, buffer: KVBuffer) -> None:
    """Write ``buffer`` at ``slots``; raises a TransferError (layout, size, checksum)
    before writing anything."""
    layout = KVLayout.of_pool(pool)
    index = _index(slots, pool)
    if len(torch.unique(index)) != len(index):
        raise SlotError("import slots repeat: each token needs a slot of its own")
    buffer.verify(layout, len(index))
    scatter_tokens(pool, index, tokens_of(buffer).to(pool.device))


def tokens_of(buffer: KVBuffer) -> torch.Tensor:
    """The payload as a CPU tensor [T, 2, layers, kv_heads, head_dim] (a view, no copy).
    NOTE: read it only; the payload is shared and its checksum cached."""
    lay = buffer.layout
    if not buffer.nbytes:
        return torch.empty((0, *lay.token_shape), dtype=lay.torch_dtype)
    with warnings.catch_warnings():  # torch warns about read-only memory; the view is only read
        warnings.simplefilter("ignore", UserWarning)
        raw = torch.frombuffer(buffer.payload, dtype=torch.uint8)
    return raw.view(lay.torch_dtype).view(buffer.num_tokens, *lay.token_shape)


def _bytes_view(data: torch.Tensor) -> memoryview:
    """A memoryview of a contiguous CPU tensor's bytes (works for bfloat16, which numpy lacks)."""
    return memoryview(data.reshape(-1).view(torch.uint8).numpy())


def _index(slots: torch.Tensor, pool: KVPool) -> torch.Tensor:
    index = torch.as_tensor(slots, dtype=torch.int64).reshape(-1).to(pool.device)
    if len(index) and (int(index.min()) < 0 or int(index.max()) >= pool.num_slots):
        raise SlotError(f"slots out of range [0, {pool.num_slots})")
    return index
