"""A decode step's decoder layers in one C++ call (``libs/kernels/csrc/layer_loop.cpp``).

The eager model (model.py) calls ~9 kernels a layer from Python: the linears, RoPE, the KV
store, decode attention, the residual add fused with RMSNorm, SiLU-and-multiply. Where the
attention backend hands over a decode-only step (the ``cpu`` backend's ``decode_step``), one
C++ call runs the same kernels in the same order, each linear on the form weights.py packed
it in (the tile kernels of ``libs.kernels.gemm``, oneDNN's packed matmul, or a plain weight;
tiles+onednn's by the step's rows, as ``weights.linear`` picks): the same result bit for bit,
without those calls' Python dispatch, and without the GIL for the whole step (the worker's
event loop runs meanwhile). Prefill and mixed steps keep the Python loop.
"""

from __future__ import annotations

import torch

from libs.kernels import KVPool, cpu_ext, gemm
from libs.kernels.base import DecodeStep
from libs.kernels.cpu_ops import RopeStep

from .config import ModelConfig
from .weights import HYBRID_ROWS, LINEARS, HybridWeight, ModelWeights, PackedWeight


def _form(w, dense: bool) -> torch.Tensor:
    """What the C++ loop multiplies by: the tiles, oneDNN's packed weight or the plain one; of a
    tiles+onednn weight, the oneDNN form with ``dense`` (steps of HYBRID_ROWS rows and up), else its tiles."""
    if isinstance(w, HybridWeight):
        w = w.dense if dense else w.tiles
    if isinstance(w, gemm.TiledWeight):
        return w.tiles
    return w.packed if isinstance(w, PackedWeight) else w


class LayerLoop:
    """The model's layers over one KV pool, handed to C++ once per linear form (weights and
    pools by reference, nothing copied)."""

    def __init__(self, weights: ModelWeights, cfg: ModelConfig, kv: KVPool) -> None:
        self.kv = kv
        self._weights, self._cfg = weights, cfg
        self._hybrid = any(isinstance(getattr(layer, n), HybridWeight) for layer in weights.layers for n in LINEARS)
        self._loops: dict[bool, object] = {}  # dense -> the C++ DecodeLayers

    @classmethod
    def build(cls, model, kv: KVPool) -> LayerLoop | None:
        """The loop for ``model`` (a LlamaModel or subclass) and ``kv``; None unless the model opts
        in (``model.fast_decode_loop``: its layer is the one the C++ loop hard-codes), or off the
        CPU (the C++ kernels are CPU kernels)."""
        if not getattr(model, "fast_decode_loop", False) or kv.device.type != "cpu":
            return None
        return cls(model.weights, model.config, kv)

    def _layers(self, dense: bool):
        if dense not in self._loops:
            flat, biases, widths = [], [], []
            for layer in self._weights.layers:
                qkv, o, gate_up, down = (_form(getattr(layer, n), dense) for n in LINEARS)
                flat += [layer.input_norm, qkv, o, layer.post_norm, gate_up, down]
                biases += [layer.qkv_bias, layer.o_bias, layer.gate_up_bias, layer.down_bias]
                widths += [getattr(layer, n).shape[0] for n in LINEARS]
            cfg = self._cfg
            self._loops[dense] = cpu_ext.load().DecodeLayers(flat, biases, widths, self.kv.k, self.kv.v, cfg.num_heads,
                                                             cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps)
        return self._loops[dense]

    def forms(self) -> list[bool]:
        """Which forms were built so far (True: tiles+onednn's oneDNN one, or the only one)."""
        return sorted(self._loops)

    def run(self, x: torch.Tensor, rope: RopeStep, step: DecodeStep) -> torch.Tensor:
        """The residual stream after the last layer for the embeddings ``x`` ([T, hidden],
        updated in place), every token a decode token of ``step``."""
        r = rope.rotary
        layers = self._layers(self._hybrid and x.shape[0] >= HYBRID_ROWS)
        return layers.run(x, rope.positions, r.cos, r.sin, step.slots, step.table, step.rows, step.lens,
                          step.tokens, step.scale)
