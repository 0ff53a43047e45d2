"""Gemma 3 text (``Gemma3ForCausalLM``; the text model of ``Gemma3ForConditionalGeneration``).

HF's ``models/gemma3/modeling_gemma3.py`` is the reference. What differs from the Llama layer:

- the embedding is scaled by sqrt(hidden_size), rounded to the model's dtype (as HF does);
- every RMSNorm multiplies by (1 + w), in float32 before the cast back (HF's Gemma3RMSNorm:
  ``(x * w).to(dtype)``, not Llama's ``w * x.to(dtype)``): the loader adds the 1 once, in float32;
- sandwich norms: the attention output and the MLP output are normed before each residual add
  (post_attention, post_feedforward), and the MLP's input has its own (pre_feedforward);
- GeGLU: ``down(gelu_tanh(gate) * up)``;
- per-head RMSNorm of q and k before RoPE; softmax scale ``query_pre_attn_scalar ** -0.5``;
- local (sliding-window) and global layers, interleaved (``layer_types``, or the legacy
  ``sliding_window_pattern``: every pattern-th layer global), each kind with its own rope base
  (``rope_parameters[layer type]``, or legacy ``rope_local_base_freq`` / ``rope_theta`` +
  ``rope_scaling``, the scaling on the global layers only);
- ``final_logit_softcapping``: ``tanh(logits / cap) * cap`` where configured.

Its layer is not the Llama one the C++ decode loop and the compiled pieces hard-code, so decode
runs the Python layers and ``--compile`` is refused.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

from libs.kernels import AttentionBackend
from libs.kernels import ops as torch_ops

from .config import ModelConfig
from .layers import ROPE_TYPES, rotary
from .llama import LlamaModel
from .weights import LayerWeights, ModelWeights, linear, load_weights

LOCAL, GLOBAL = "sliding_attention", "full_attention"
DEFAULT_THETA = {LOCAL: 10_000.0, GLOBAL: 1_000_000.0}  # HF's when a config names none
PRE_FF, POST_FF = "pre_feedforward_layernorm", "post_feedforward_layernorm"
# (text model prefix, LM head): Gemma3ForCausalLM; the wrapper as transformers 5 and 4 save it
LAYOUTS = (("model.", "lm_head.weight"), ("model.language_model.", "lm_head.weight"),
           ("language_model.model.", "language_model.lm_head.weight"))
# the wrapper's parts that are not the text model: multimodal inputs are not served
VISION = ("model.vision_tower.", "model.multi_modal_projector.", "vision_tower.", "multi_modal_projector.")


def text_config(raw: dict) -> dict:
    return raw.get("text_config") or raw


def layer_types(cfg: dict) -> list[str]:
    """Each layer's kind, LOCAL or GLOBAL."""
    if cfg.get("layer_types"):
        return list(cfg["layer_types"])
    pattern = cfg.get("sliding_window_pattern", 6)
    return [LOCAL if (i + 1) % pattern else GLOBAL for i in range(cfg["num_hidden_layers"])]


def layer_rope(cfg: dict, kind: str) -> tuple[float, dict | None]:
    """(rope base, rope scaling or None) of the layers of ``kind``."""
    ropes = cfg.get("rope_parameters")
    if isinstance(ropes, dict) and isinstance(ropes.get(kind), dict):
        rope = ropes[kind]
        scaled = rope.get("rope_type", rope.get("type", "default")) != "default"
        return float(rope.get("rope_theta", DEFAULT_THETA[kind])), rope if scaled else None
    if kind == LOCAL:
        return float(cfg.get("rope_local_base_freq", DEFAULT_THETA[LOCAL])), None
    return float(cfg.get("rope_theta", DEFAULT_THETA[GLOBAL])), cfg.get("rope_scaling") or None


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, ops=torch_ops) -> torch.Tensor:
    """Gemma's RMSNorm with ``weight`` already (1 + w) in float32: the backend's kernel under fp32,
    HF's order (scale in float32, then cast) under bf16."""
    if x.dtype == torch.float32:
        return ops.rmsnorm(x.contiguous(), weight, eps)
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight).to(x.dtype)


class Gemma3Model(LlamaModel):
    FEATURES = frozenset({"act:gelu_pytorch_tanh", "sliding_window", "text_config", "softcap:final",
                          *(f"rope:{t}" for t in ROPE_TYPES if t != "longrope")})  # NOTE: longrope untested here
    FAST_DECODE_LOOP = False  # NOTE: the C++ loop is the Llama layer
    COMPILED_STEP = False  # NOTE: so are compiled.py's pieces
    QK_NORM = True

    def __init__(self, path: Path, dtype: torch.dtype = torch.float32, device="cpu", **options) -> None:
        super().__init__(path, dtype, device, **options)
        cfg, text = self.config, text_config(self.config.raw)
        self.types = layer_types(text)
        window = text.get("sliding_window")
        binds = bool(window) and window < cfg.max_position_embeddings
        # NOTE: the windows as this family lays them out (a legacy config without layer_types too)
        self.config = cfg = replace(cfg, sliding_windows=tuple(window if t == LOCAL and binds else None
                                                               for t in self.types))
        served = self.rotary.cos.shape[0]
        self.rotaries = {}
        for kind in sorted(set(self.types)):
            theta, scaling = layer_rope(text, kind)
            self.rotaries[kind] = rotary(replace(cfg, rope_theta=theta, rope_scaling=scaling), served, device)
        self.rotary = self.rotaries.get(GLOBAL, next(iter(self.rotaries.values())))
        self.attention_scale = float(text.get("query_pre_attn_scalar", cfg.head_dim)) ** -0.5
        self.softcap = text.get("final_logit_softcapping") or None
        self.embed_scale = torch.tensor(cfg.hidden_size**0.5).to(dtype)

    def _load_weights(self, path: Path, cfg: ModelConfig, dtype: torch.dtype, device) -> ModelWeights:
        w = load_weights(path, cfg, dtype, device, qk_norm=True, layouts=LAYOUTS, layer_norms=(PRE_FF, POST_FF),
                         ignore=VISION)
        one_plus = lambda t: 1.0 + t.float()  # noqa: E731 - HF's (1 + w), in float32
        for layer in w.layers:
            layer.input_norm, layer.post_norm = one_plus(layer.input_norm), one_plus(layer.post_norm)
            layer.q_norm, layer.k_norm = one_plus(layer.q_norm), one_plus(layer.k_norm)
            layer.norms = {name: one_plus(t) for name, t in layer.norms.items()}
        w.final_norm = one_plus(w.final_norm)
        return w

    def hidden(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend,
               rows: torch.Tensor | None = None) -> torch.Tensor:
        """The residual stream after the last layer (of the tokens at ``rows`` where given)."""
        w, ops, eps = self.weights, attn.ops, self.config.rms_norm_eps
        ropes = {kind: ops.rope_cache(r, positions, self.dtype) for kind, r in self.rotaries.items()}
        x = F.embedding(input_ids, w.embed) * self.embed_scale
        last = len(w.layers) - 1
        for i, layer in enumerate(w.layers):
            q, k, v = self._attention_in(rmsnorm(x, layer.input_norm, eps, ops), layer, ropes[self.types[i]], ops)
            o = attn.forward(i, q, k, v)  # NOTE: stores every token's K/V
            if i == last and rows is not None:  # NOTE: nothing reads the other rows' last o_proj and MLP
                x, o = x.index_select(0, rows), o.index_select(0, rows)
            o = linear(o.reshape(x.shape[0], -1), layer.o_proj, layer.o_bias)
            x = x + rmsnorm(o, layer.post_norm, eps, ops)
            x = x + rmsnorm(self._mlp(rmsnorm(x, layer.norms[PRE_FF], eps, ops), layer), layer.norms[POST_FF], eps, ops)
        return x

    def logits(self, x: torch.Tensor, last_index: torch.Tensor | None, ops=torch_ops) -> torch.Tensor:
        x = x if last_index is None else x.index_select(0, last_index)
        logits = linear(rmsnorm(x, self.weights.final_norm, self.config.rms_norm_eps, ops), self.weights.lm_head)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits.float()

    def _attention_in(self, h, layer: LayerWeights, rope, ops):
        cfg, t, d = self.config, h.shape[0], self.config.head_dim
        qkv = linear(h, layer.qkv, layer.qkv_bias)
        q = rmsnorm(qkv[:, : self._q_heads * d].reshape(-1, d), layer.q_norm, cfg.rms_norm_eps, ops)
        k = rmsnorm(qkv[:, self._q_heads * d : self._qk_width].reshape(-1, d), layer.k_norm, cfg.rms_norm_eps, ops)
        qk = ops.rope_qk(torch.cat([q.view(t, -1), k.view(t, -1)], dim=1), self._qk_heads, d, rope)
        v = qkv[:, self._qk_width :].view(t, cfg.num_kv_heads, d)
        return qk[:, : self._q_heads], qk[:, self._q_heads :], v

    @staticmethod
    def _mlp(h: torch.Tensor, layer: LayerWeights) -> torch.Tensor:
        """GeGLU: ``down(gelu_tanh(gate) * up)`` over the fused [gate | up] projection."""
        gate, up = linear(h, layer.gate_up, layer.gate_up_bias).chunk(2, dim=-1)
        return linear(F.gelu(gate, approximate="tanh").mul_(up), layer.down, layer.down_bias)
