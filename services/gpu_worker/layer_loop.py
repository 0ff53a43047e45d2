"""A decode step's decoder layers in one C++ call (``libs/kernels/csrc/layer_loop.cpp``).

The eager model (model.py) calls ~9 kernels a layer from Python: the linears, RoPE, the KV
store, decode attention, the residual add fused with RMSNorm, SiLU-and-multiply. Where every
linear runs on the tile kernels (``libs.kernels.gemm``: fp32 over bf16 weights on AVX2, bf16
on AVX512-BF16) and the attention backend hands over a decode-only step (the ``cpu``
backend's ``decode_step``), one C++ call runs the same kernels in the same order: the same
result bit for bit, without those calls' Python dispatch, and without the GIL for the whole
step (the worker's event loop runs meanwhile). Prefill and mixed steps, and every other
kernel choice, keep the Python loop.
"""

from __future__ import annotations

import torch

from libs.kernels import KVPool, cpu_ext, gemm
from libs.kernels.base import DecodeStep
from libs.kernels.cpu_ops import RopeStep  # noqa: F401 - model.py takes it from here

from .config import ModelConfig
from .weights import HybridWeight, ModelWeights


def _tiles(w) -> gemm.TiledWeight | None:
    """The tile form of a packed weight (tiles+onednn's below HYBRID_ROWS rows), or None."""
    if isinstance(w, HybridWeight):
        return w.tiles
    return w if isinstance(w, gemm.TiledWeight) else None


class LayerLoop:
    """The model's layers over one KV pool, handed to C++ once (weights and pools by reference)."""

    def __init__(self, module, weights: ModelWeights, cfg: ModelConfig, kv: KVPool) -> None:
        flat, biases, widths = [], [], []
        for layer in weights.layers:
            linears = [_tiles(getattr(layer, name)) for name in ("qkv", "o_proj", "gate_up", "down")]
            qkv, o, gate_up, down = (t.tiles for t in linears)
            flat += [layer.input_norm, qkv, o, layer.post_norm, gate_up, down]
            biases += [layer.qkv_bias, layer.o_bias, layer.gate_up_bias, layer.down_bias]
            widths += [t.shape[0] for t in linears]
        self.kv = kv
        self._layers = module.DecodeLayers(flat, biases, widths, kv.k, kv.v, cfg.num_heads, cfg.num_kv_heads,
                                           cfg.head_dim, cfg.rms_norm_eps)

    @staticmethod
    def fits(weights: ModelWeights, kv: KVPool) -> bool:
        """Whether every linear has a tile form and the pool is on the CPU."""
        names = ("qkv", "o_proj", "gate_up", "down")
        tiled = all(_tiles(getattr(layer, n)) is not None for layer in weights.layers for n in names)
        return tiled and kv.device.type == "cpu"

    @classmethod
    def build(cls, weights: ModelWeights, cfg: ModelConfig, kv: KVPool) -> LayerLoop | None:
        """The loop for this model and pool, or None where it does not fit (``fits``)."""
        if not cls.fits(weights, kv):
            return None
        return cls(cpu_ext.load(), weights, cfg, kv)

    def run(self, x: torch.Tensor, rope: RopeStep, step: DecodeStep) -> torch.Tensor:
        """The residual stream after the last layer for the embeddings ``x`` ([T, hidden],
        updated in place), every token a decode token of ``step``."""
        r = rope.rotary
        return self._layers.run(x, rope.positions, r.cos, r.sin, step.slots, step.table, step.rows, step.lens,
                                step.tokens, step.scale)
