"""The Llama family (Llama 1-3.x, SmolLM2, Mistral, Qwen2 / 2.5) over a flattened token batch;
the layer other families build on (qwen3.py)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from libs.kernels import AttentionBackend
from libs.kernels import ops as torch_ops
from libs.kernels.base import DecodeStep
from libs.kernels.cpu_ops import RopeStep

from .config import ModelConfig
from .features import refuse_unsupported
from .layer_loop import LayerLoop
from .layers import ROPE_TYPES, rotary
from .weights import (FIXED, SPLIT_NAMES, LayerWeights, ModelWeights, fp32_copy_fits, linear, linear_kernel,
                      load_weights, pack_weights)


class LlamaModel:
    """Weights plus the forward pass; KV lives in the attention backend's pool.

    The batch is flattened to [T, hidden]; only each request's last token goes
    through the final norm and the LM head.
    """

    # what this family implements of a config (features.py); the rest is refused at start
    # (a sliding window: on the backends that have one, ModelRunner checks)
    FEATURES = frozenset({"act:silu", "sliding_window", *(f"rope:{t}" for t in ROPE_TYPES)})
    # NOTE: the C++ decode loop (layer_loop.cpp) hard-codes this layer: a family that changes the
    # layer opts out, and so does a config using a feature the loop lacks
    FAST_DECODE_LOOP = True
    QK_NORM = False  # per-head q/k RMSNorm weights in the checkpoint (qwen3.py)
    WEIGHT_NAMES = SPLIT_NAMES  # the checkpoint's parts of the fused qkv / gate_up (phi3.py: FUSED_NAMES)

    def __init__(self, path: Path, dtype: torch.dtype = torch.float32, device="cpu", pack: bool = True,
                 kernel: str = "auto", bf16_weights: bool = False, max_positions: int | None = None,
                 deterministic: bool = False) -> None:
        self.config = cfg = ModelConfig.from_dir(path)
        refuse_unsupported(cfg.raw, self.FEATURES, f"{path} ({cfg.architecture})")
        self.fast_decode_loop = self.FAST_DECODE_LOOP and not any(cfg.sliding_windows)
        self.dtype, self.device = dtype, torch.device(device)
        self.weights = self._load_weights(path, cfg, dtype, device)
        # NOTE: packed (oneDNN-blocked) weights are opaque to torch.compile: a compiled
        # step keeps plain ones
        # ``kernel``: the linears' packed form (weights.linear_kernel; ``bf16_weights``: auto's
        # pick for fp32 on AVX2)
        # ``deterministic``: a batch-invariant form (weights._invariant_kernel)
        self.linear_kernel = linear_kernel(kernel, dtype, self.device, bf16_weights=bf16_weights,
                                           fp32_copy_fits=fp32_copy_fits(self.weights),
                                           deterministic=deterministic) if pack or deterministic else "plain"
        self.packed = self.linear_kernel != "plain"
        self.fast_decode_loop &= self.linear_kernel != FIXED  # NOTE: the C++ loop runs gemm_f32.cpp unpadded
        if self.packed:
            pack_weights(self.weights, self.linear_kernel)
        self.rotary = rotary(cfg, min(max_positions or cfg.max_position_embeddings, cfg.max_position_embeddings), device)
        self._q_heads = cfg.num_heads
        self._qk_heads = cfg.num_heads + cfg.num_kv_heads
        self._qk_width = self._qk_heads * cfg.head_dim
        self.layer_loop = True  # decode steps' layers in one C++ call where they fit (layer_loop.py)
        self._loop: LayerLoop | None = None

    def _load_weights(self, path: Path, cfg: ModelConfig, dtype: torch.dtype, device) -> ModelWeights:
        """The checkpoint's weights as this family lays them out (a hook: gemma3.py)."""
        return load_weights(path, cfg, dtype, device, qk_norm=self.QK_NORM, names=self.WEIGHT_NAMES,
                            experts=self.read_experts)

    def read_experts(self, reader, layer: int):
        """Layer ``layer``'s mixture-of-experts weights from the checkpoint's ``reader`` (moe.py); None: a dense MLP."""
        return None

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
        return self.logits(self.hidden(input_ids, positions, attn, rows=last_index), None, attn.ops)

    def hidden(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend,
               rows: torch.Tensor | None = None) -> torch.Tensor:
        """The residual stream after the last layer ([T, hidden]), eagerly, op by op (a decode
        step's layers in one C++ call where they fit: ``_layer_loop_step``); with
        ``rows``, of those tokens only: nothing reads the others' last o_proj and MLP (a
        prefill chunk's last layer then runs its linears on a row per request, not per token)."""
        w, ops = self.weights, attn.ops  # NOTE: elementwise kernels that match the attention backend
        rope = ops.rope_cache(self.rotary, positions, self.dtype)
        if (step := self._layer_loop_step(attn, rope)) is not None:
            x = self._loop.run(F.embedding(input_ids, w.embed), rope, step)
            return x if rows is None else x.index_select(0, rows)
        x, q, k, v = self.first_piece(input_ids, rope, w.layers[0], ops)
        for i in range(1, len(w.layers)):
            x, q, k, v = self.middle_piece(x, attn.forward(i - 1, q, k, v), rope, w.layers[i - 1], w.layers[i], ops)
        o = attn.forward(len(w.layers) - 1, q, k, v)  # NOTE: stores every token's K/V
        if rows is not None:
            x, o = x.index_select(0, rows), o.index_select(0, rows)
        return self.last_piece(x, o, w.layers[-1], ops)

    def _layer_loop_step(self, attn: AttentionBackend, rope) -> DecodeStep | None:
        """The step's arguments where the C++ layer loop (``self._loop``, built here once) runs
        it: a decode-only step (the backend's ``decode_step``) with the C++ RoPE (layer_loop.py);
        else None."""
        step = attn.decode_step() if self.layer_loop and isinstance(rope, RopeStep) else None
        if step is None:
            return None
        if self._loop is None or self._loop.kv is not attn.kv:
            self._loop = LayerLoop.build(self, attn.kv)
            self.layer_loop = self._loop is not None  # NOTE: the weights do not change: asked once
        return step if self._loop is not None else None

    def logits(self, x: torch.Tensor, last_index: torch.Tensor | None, ops=torch_ops) -> torch.Tensor:
        """Final norm and LM head over the rows of ``x`` at ``last_index`` (None: every row; float32 logits)."""
        x = x if last_index is None else x.index_select(0, last_index)
        x = ops.rmsnorm(x, self.weights.final_norm, self.config.rms_norm_eps)
        return linear(x, self.weights.lm_head).float()

    # -- the pieces between attention calls (what a compiled step compiles) ------------
    #
    #   first:  embed -> layer 0 attention input          -> attention 0
    #   middle: layer i-1 o_proj + MLP -> layer i input   -> attention i   (i = 1 .. L-1)
    #   last:   layer L-1 o_proj + MLP                    -> final norm, LM head (eager)
    #
    # NOTE: each residual add is fused with the RMSNorm after it (ops.add_rmsnorm, in
    # place in C++): a layer's MLP output is carried to the next layer's input norm.

    def first_piece(self, input_ids, rope, layer: LayerWeights, ops=torch_ops):
        x = F.embedding(input_ids, self.weights.embed)
        return (x, *self._attention_in(ops.rmsnorm(x, layer.input_norm, self.config.rms_norm_eps), layer, rope, ops))

    def middle_piece(self, x, o, rope, done: LayerWeights, layer: LayerWeights, ops=torch_ops):
        x, mlp = self._layer_out(x, o, done, ops)
        x, h = ops.add_rmsnorm(x, mlp, layer.input_norm, self.config.rms_norm_eps)
        return (x, *self._attention_in(h, layer, rope, ops))

    def last_piece(self, x, o, done: LayerWeights, ops=torch_ops):
        x, mlp = self._layer_out(x, o, done, ops)
        return x + mlp

    def _attention_in(self, h, layer: LayerWeights, rope, ops):
        """q, k ([T, heads | kv_heads, D], rotated) and v of layer ``layer`` from its normed input ``h``."""
        cfg, t = self.config, h.shape[0]
        qkv = linear(h, layer.qkv, layer.qkv_bias)
        qk = ops.rope_qk(qkv, self._qk_heads, cfg.head_dim, rope)
        v = qkv[:, self._qk_width :].view(t, cfg.num_kv_heads, cfg.head_dim)
        return qk[:, : self._q_heads], qk[:, self._q_heads :], v

    def _layer_out(self, x, o, layer: LayerWeights, ops):
        """The residual stream after a layer's attention output ``o`` ([T, heads, D]), and the
        layer's MLP output (not yet added to it)."""
        o = linear(o.reshape(x.shape[0], -1), layer.o_proj, layer.o_bias)
        x, h = ops.add_rmsnorm(x, o, layer.post_norm, self.config.rms_norm_eps)
        gate_up = linear(h, layer.gate_up, layer.gate_up_bias)
        return x, linear(ops.silu_mul(gate_up), layer.down, layer.down_bias)
