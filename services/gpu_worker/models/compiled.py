"""A compiled step: the model's pieces between attention calls, compiled by inductor.

Piecewise, as vLLM compiles its backbone: the three pieces of :class:`LlamaModel`
(first / middle / last, see there) are compiled once per token-count bucket; the
attention calls between them, the KV stores and the LM head stay eager. A step of T
tokens runs padded to the smallest bucket >= T (the way CUDA-graph capture sizes
work); steps longer than the largest bucket (long prefills) run eagerly.

Padded rows::

    tokens  | 0 .. T-1: the step's tokens | T .. n-1: padding (id 0, position 0) |

Every op inside a piece is row-wise (linear, RMSNorm, RoPE, SiLU), so padding never
mixes into real rows; attention sees only rows [0, T) (so padding writes no KV slot),
and only real rows reach the LM head (so sampling never sees padding).

The pieces run the torch elementwise ops (:mod:`libs.kernels.ops`), which inductor
fuses into its own loops, or (``ops="cpp"``) the C++ ones registered as torch custom ops
(:mod:`libs.kernels.cpu_library`: in place, as their schemas declare).

Compiled code is cached on disk (inductor's cache under ``~/.cache/radixmesh/inductor``,
``$TORCHINDUCTOR_CACHE_DIR`` if set), so a second start only traces.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Callable

import torch

from libs.kernels import AttentionBackend, AttentionMetadata
from libs.kernels import ops as torch_ops

from .features import UnsupportedModel
from .llama import LlamaModel

log = logging.getLogger("gpu_worker")

# like CUDA-graph capture sizes: dense where decode batches are, sparser above
DEFAULT_SIZES = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128)


def piece_ops(name: str):
    """The elementwise ops inside the compiled pieces: ``torch`` (inductor fuses them into
    its loops) or ``cpp`` (the C++ kernels as custom ops, :mod:`libs.kernels.cpu_library`)."""
    if name == "torch":
        return torch_ops
    if name == "cpp":
        from libs.kernels import cpu_library

        cpu_library.load()
        return cpu_library
    raise ValueError(f"compiled ops {name!r}: want torch or cpp")


def cache_dir() -> Path:
    """Inductor's on-disk cache: ``$TORCHINDUCTOR_CACHE_DIR`` when a user set it, else ours.

    NOTE: inductor writes its own default (a temp dir) into the environment the first
    time it looks, so that value counts as unset.
    """
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if current is None or os.path.abspath(current) == os.path.abspath(default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path.home() / ".cache" / "radixmesh" / "inductor")
    path = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    path.mkdir(parents=True, exist_ok=True)
    return path


class CompiledStep:
    """The model's forward with its pieces compiled per bucket of ``sizes`` tokens."""

    def __init__(self, model: LlamaModel, attn: AttentionBackend, sizes=DEFAULT_SIZES, ops: str = "torch") -> None:
        import functools

        import torch._dynamo

        if not getattr(model, "COMPILED_STEP", True):
            raise UnsupportedModel(f"--compile: the compiled pieces are the Llama layer, not {model.config.architecture}'s")
        cache_dir()
        self.model, self.attn = model, attn
        self.sizes = sorted(set(int(n) for n in sizes))
        # NOTE: one graph per bucket and piece (and per thread count: dynamo guards on
        # it); its default limit (8) would fail the larger buckets
        limit = 4 * len(self.sizes) + 8
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), limit))
        compile_ = lambda fn: torch.compile(fn, dynamic=False, fullgraph=True)  # noqa: E731
        self.ops = piece_ops(ops)
        self._first = compile_(functools.partial(model.first_piece, ops=self.ops))
        self._middle = compile_(functools.partial(model.middle_piece, ops=self.ops))
        self._last = compile_(functools.partial(model.last_piece, ops=self.ops))
        cfg, dev = model.config, model.device
        self._ids = torch.zeros(self.sizes[-1], dtype=torch.int64, device=dev)
        self._positions = torch.zeros(self.sizes[-1], dtype=torch.int64, device=dev)
        self._out = torch.zeros(self.sizes[-1], cfg.num_heads, cfg.head_dim, dtype=model.dtype, device=dev)
        attn.init_capture(self.sizes)

    def bucket(self, num_tokens: int) -> int | None:
        """The padded size of a step of ``num_tokens`` tokens (None: run it eagerly)."""
        for n in self.sizes:
            if n >= num_tokens:
                return n
        return None

    @torch.inference_mode()
    def warm_up(self, progress: Callable[[str], None] = log.info) -> float:
        """Compile every bucket (or load it from the cache); returns the seconds it took."""
        start = time.perf_counter()
        for i, n in enumerate(self.sizes):
            t0 = time.perf_counter()
            progress(f"compiling the step for {n} tokens ({i + 1}/{len(self.sizes)})")
            self._run(n, n, attend=lambda layer, q, k, v, out: out)
            log.debug("bucket %d ready in %.1f s", n, time.perf_counter() - t0)
        total = time.perf_counter() - start
        progress(f"compiled step ready: {len(self.sizes)} buckets up to {self.sizes[-1]} tokens in {total:.1f} s "
                 f"(cache {cache_dir()})")
        return total

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, last_index: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        """Like ``LlamaModel.forward`` after preparing ``attn`` for ``meta``; eager past the largest bucket."""
        t = input_ids.shape[0]
        n = self.bucket(t)
        if n is None:
            self.attn.prepare(meta)
            return self.model.forward(input_ids, positions, last_index, self.attn)
        self.attn.prepare_for_replay(meta, n)
        self._ids[:t].copy_(input_ids)
        self._positions[:t].copy_(positions)
        x = self._run(t, n, attend=self._attend)
        return self.model.logits(x, last_index)

    def _attend(self, layer: int, q, k, v, out: torch.Tensor) -> torch.Tensor:
        self.attn.forward(layer, q, k, v, out=out)
        return out

    def _run(self, t: int, n: int, attend) -> torch.Tensor:
        """The pieces over ``n`` padded rows, attention over the first ``t``."""
        layers = self.model.weights.layers
        rope = self.ops.rope_cache(self.model.rotary, self._positions[:n], self.model.dtype)
        out = self._out[:n]
        x, q, k, v = self._first(self._ids[:n], rope, layers[0])
        for i in range(1, len(layers)):
            attend(i - 1, q[:t], k[:t], v[:t], out[:t])
            x, q, k, v = self._middle(x, out, rope, layers[i - 1], layers[i])
        attend(len(layers) - 1, q[:t], k[:t], v[:t], out[:t])
        return self._last(x, out, layers[-1])
