"""Llama-family decoder (Llama, SmolLM2, Qwen2) over a flattened token batch."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from libs.kernels import AttentionBackend
from libs.kernels.ops import Rotary, rope_inv_freq

from .config import ModelConfig
from .weights import LayerWeights, load_weights


class LlamaModel:
    """Weights plus the forward pass; KV lives in the attention backend's pool.

    The batch is flattened to [T, hidden]; only each request's last token goes
    through the final norm and the LM head.
    """

    def __init__(self, path: Path, dtype: torch.dtype = torch.float32, device="cpu") -> None:
        self.config = cfg = ModelConfig.from_dir(path)
        self.dtype, self.device = dtype, torch.device(device)
        self.weights = load_weights(path, cfg, dtype, device)
        inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        self.rotary = Rotary(inv_freq, cfg.max_position_embeddings, device)
        self._q_heads = cfg.num_heads
        self._qk_width = (cfg.num_heads + cfg.num_kv_heads) * cfg.head_dim

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        last_index: torch.Tensor,
        attn: AttentionBackend,
    ) -> torch.Tensor:
        """Logits (float32, [B, vocab]) of the tokens at ``last_index``.

        ``input_ids`` / ``positions`` are [T] int64; ``attn`` is already prepared
        for this step.
        """
        w = self.weights
        eps = self.config.rms_norm_eps
        ops = attn.ops  # NOTE: elementwise kernels that match the attention backend
        rope = self.rotary.lookup(positions, self.dtype)
        x = F.embedding(input_ids, w.embed)
        for i, layer in enumerate(w.layers):
            x = x + self._attention(i, layer, ops.rmsnorm(x, layer.input_norm, eps), rope, attn)
            x = x + self._mlp(layer, ops.rmsnorm(x, layer.post_norm, eps), ops)
        x = ops.rmsnorm(x.index_select(0, last_index), w.final_norm, eps)
        return F.linear(x, w.lm_head).float()

    def _attention(self, i: int, layer: LayerWeights, h: torch.Tensor, rope, attn) -> torch.Tensor:
        cfg, t = self.config, h.shape[0]
        qkv = F.linear(h, layer.qkv, layer.qkv_bias)
        qk = attn.ops.apply_rope(qkv[:, : self._qk_width].view(t, -1, cfg.head_dim), *rope)
        q, k = qk[:, : self._q_heads], qk[:, self._q_heads :]
        v = qkv[:, self._qk_width :].view(t, cfg.num_kv_heads, cfg.head_dim)
        o = attn.forward(i, q, k, v)
        return F.linear(o.reshape(t, -1), layer.o_proj, layer.o_bias)

    def _mlp(self, layer: LayerWeights, h: torch.Tensor, ops) -> torch.Tensor:
        gate_up = F.linear(h, layer.gate_up, layer.gate_up_bias)
        return F.linear(ops.silu_mul(gate_up), layer.down, layer.down_bias)
