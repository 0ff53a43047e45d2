"""The interface every attention backend implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from types import ModuleType

import numpy as np
import torch

from . import ops as torch_ops
from .errors import BackendNotAvailable
from .kv_pool import KVPool

# (queries, pool): the one pair of different dtypes a backend with ``mixed_kv`` takes
MIXED_KV = (torch.float32, torch.bfloat16)


@dataclass(frozen=True)
class AttentionMetadata:
    """One step's layout, shared by every layer.

    Request ``i`` owns row ``rows[i]`` of ``slot_table`` (the worker's
    [max_requests, max_len] row -> slot table, already holding this step's new
    slots), has ``prefix_lens[i]`` tokens cached and adds ``extend_lens[i]``
    tokens: the i-th run of the flattened [T] token axis::

        tokens  | req0: extend_lens[0] | req1: extend_lens[1] | ...
        slots   | table[row0, prefix0 : prefix0 + extend0]   | ...

    ``prefix_lens`` / ``extend_lens`` are host arrays (int64, numpy) so that
    preparing a step never syncs with the device.
    """

    rows: torch.Tensor  # [B] int64, device
    prefix_lens: np.ndarray  # [B] int64, host
    extend_lens: np.ndarray  # [B] int64, host
    out_slots: torch.Tensor  # [T] int64, device: where the new tokens' K/V go
    slot_table: torch.Tensor  # [max_requests, max_len] int64, device

    @property
    def seq_lens(self) -> np.ndarray:
        return self.prefix_lens + self.extend_lens

    @property
    def num_tokens(self) -> int:
        return int(self.extend_lens.sum())


@dataclass(frozen=True)
class DecodeStep:
    """A decode-only step's arguments for the C++ decode kernel, shared by every layer:
    where each token's K/V goes, and each request's slot-table row and length."""

    slots: torch.Tensor  # [T] int64
    table: torch.Tensor  # [max_requests, max_len] int64
    rows: torch.Tensor  # [B] int64
    lens: torch.Tensor  # [B] int64: keys each query attends (its own included)
    tokens: torch.Tensor  # [B] int64 query token of each request, or empty: request b's is token b
    scale: float


class AttentionBackend(ABC):
    """Attention over a :class:`KVPool`; ``prepare`` once per step, ``forward`` per layer.

    ``ops`` is the module of elementwise kernels (``rmsnorm``, ``add_rmsnorm``,
    ``rope_cache`` / ``rope_qk``, ``silu_mul``, same signatures as
    :mod:`libs.kernels.ops`) that suits this backend's device.

    ``dtype`` is the queries' (the model's activations); the pool holds KV in another only
    where the backend takes it (``mixed_kv``: fp32 queries over a bf16 pool, MIXED_KV).
    """

    name: str = ""
    ops: ModuleType = torch_ops
    mixed_kv: bool = False
    sliding_window: bool = False  # whether it attends within per-layer windows (``set_windows``)
    batch_invariant: bool = False  # whether it has a deterministic mode (``set_deterministic``)

    def __init__(self, kv: KVPool, scale: float | None = None, dtype: torch.dtype | None = None) -> None:
        self.check_available(kv.device, kv.dtype)
        self.dtype = kv.dtype if dtype is None else dtype
        if self.dtype != kv.dtype and not (self.mixed_kv and (self.dtype, kv.dtype) == MIXED_KV):
            taken = " (it takes fp32 queries over a bf16 pool)" if self.mixed_kv else ""
            raise BackendNotAvailable(f"the {self.name} attention backend needs the KV pool in the queries' "
                                      f"dtype ({self.dtype}), not {kv.dtype}{taken}")
        self.kv = kv
        self.scale = scale if scale is not None else kv.head_dim**-0.5
        self.capture_sizes: list[int] = []  # see init_capture
        self.windows: tuple[int | None, ...] = ()  # per layer: the keys a query sees at most, None: all
        self.deterministic = False  # see set_deterministic

    def set_windows(self, windows: tuple[int | None, ...]) -> None:
        """Layer i's queries attend to the ``windows[i]`` latest keys (their own included), as HF's
        sliding-window mask does; raises BackendNotAvailable where this backend has no windows."""
        if any(windows) and not self.sliding_window:
            raise BackendNotAvailable(f"the {self.name} attention backend has no sliding-window attention")
        self.windows = tuple(windows)

    def set_deterministic(self, on: bool) -> None:
        """With ``on``, every token's output is the same bits whatever step computes it: a prefill
        chunk, an extend over a cached prefix or a decode step, alone or in any batch; raises
        BackendNotAvailable where this backend has no such mode."""
        if on and not self.batch_invariant:
            raise BackendNotAvailable(f"the {self.name} attention backend has no deterministic (batch-invariant) "
                                      "mode (the cpu backend has one, and triton on CUDA)")
        self.deterministic = on

    def window(self, layer: int) -> int | None:
        return self.windows[layer] if layer < len(self.windows) else None

    @classmethod
    def check_available(cls, device: torch.device, dtype: torch.dtype | None = None) -> None:
        """Raise BackendNotAvailable (with the reason) when this backend cannot run on ``device``/``dtype``."""

    @abstractmethod
    def prepare(self, meta: AttentionMetadata) -> None:
        """Build the step's indices and masks (reused by every layer)."""

    @abstractmethod
    def forward(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Store ``k``/``v`` ([T, kv_heads, D]) at the step's slots, attend with ``q`` ([T, heads, D]).

        Each new token attends causally to its request's cached prefix and to the
        new tokens before it. Returns (or fills ``out``) [T, heads, D].
        """

    def decode_step(self) -> DecodeStep | None:
        """The prepared step as a C++ layer loop takes it (``csrc/layer_loop.cpp``), where this
        backend's kernels can run inside one and the step is decode tokens only; else None."""
        return None

    # -- captured steps: CUDA graphs, compiled CPU steps ---------------------------
    #
    # A captured step runs padded to one of a few token counts (``sizes``). The
    # runner calls ``init_capture`` once, then, for every step that runs captured,
    # ``prepare_for_replay`` instead of ``prepare``. A backend whose ``forward`` is
    # recorded inside a CUDA graph keeps static index buffers (allocated in
    # ``init_capture``, filled by ``prepare_for_capture`` for the recording and
    # copied into by ``prepare_for_replay``); one called eagerly between compiled
    # pieces (every backend on the CPU) needs nothing more than ``prepare``.

    def init_capture(self, sizes: list[int]) -> None:
        """Steps will run padded to one of ``sizes`` tokens."""
        self.capture_sizes = sorted(sizes)

    def prepare_for_capture(self, meta: AttentionMetadata, size: int) -> None:
        """Lay out ``meta`` (a step of ``size`` tokens) in the static buffers to record from."""
        self.prepare(meta)

    def prepare_for_replay(self, meta: AttentionMetadata, size: int) -> None:
        """This step, whose tokens the runner padded to ``size``: only its own
        ``meta.num_tokens`` rows are attended and stored, padding never is."""
        self.prepare(meta)
