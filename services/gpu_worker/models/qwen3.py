"""Qwen3 (dense): the Llama layer with a per-head RMSNorm on q and k before RoPE, no qkv bias."""

from __future__ import annotations

import torch

from .layers import head_rmsnorm
from .llama import LlamaModel
from .weights import LayerWeights, linear


class Qwen3Model(LlamaModel):
    QK_NORM = True
    FAST_DECODE_LOOP = False  # NOTE: the C++ loop has no q/k norm: decode runs the Python layers

    def _attention_in(self, h, layer: LayerWeights, rope, ops):
        cfg, t, d = self.config, h.shape[0], self.config.head_dim
        qkv = linear(h, layer.qkv, layer.qkv_bias)
        q = head_rmsnorm(qkv[:, : self._q_heads * d], layer.q_norm, d, cfg.rms_norm_eps, ops)
        k = head_rmsnorm(qkv[:, self._q_heads * d : self._qk_width], layer.k_norm, d, cfg.rms_norm_eps, ops)
        qk = ops.rope_qk(torch.cat([q.view(t, -1), k.view(t, -1)], dim=1), self._qk_heads, d, rope)
        v = qkv[:, self._qk_width :].view(t, cfg.num_kv_heads, d)
        return qk[:, : self._q_heads], qk[:, self._q_heads :], v
