"""Mixture-of-experts families: Qwen3-MoE (Qwen3's layer, q/k norm included, with sparse MLPs
on the layers ``decoder_sparse_step`` / ``mlp_only_layers`` pick) and Mixtral (the Llama layer,
every MLP sparse). The MoE MLP itself is moe_layer.py's."""

from __future__ import annotations

from functools import cached_property

import torch

from .features import UnsupportedModel
from .llama import LlamaModel
from .moe_layer import Experts, Router, experts_forward
from .qwen3 import Qwen3Model
from .weights import TRITON_FIXED, LayerWeights, linear


def expert_count(raw: dict) -> int:
    """Experts per sparse layer: released Qwen3-MoE configs say ``num_experts``, Mixtral's and
    transformers 5's (for both) ``num_local_experts``."""
    return raw.get("num_experts") or raw.get("num_local_experts") or 0


class MoEModel(LlamaModel):
    """What both families add to their layer: a sparse layer's weights and its MLP."""

    FEATURES = LlamaModel.FEATURES | {"moe"}
    FAST_DECODE_LOOP = False  # NOTE: the C++ loop has a dense MLP: decode runs the Python layers
    # the per-expert tensors of released checkpoints: (the block's prefix, gate, up, down names)
    PER_EXPERT = ("mlp.", "gate_proj", "up_proj", "down_proj")

    def __init__(self, path, *args, **kwargs) -> None:
        super().__init__(path, *args, **kwargs)
        # the experts through the Triton kernel (libs/kernels/fused_moe.py); a test sets it on a CPU
        self.fused_moe = self.device.type == "cuda"
        if self.linear_kernel == TRITON_FIXED:  # NOTE: its tiles are fixed, but no test shows its rows invariant
            raise UnsupportedModel("--deterministic on CUDA has no batch-invariant mixture-of-experts kernel "
                                   "(the fused MoE kernel is not shown invariant): a dense model, or the cpu backend")
        if self.packed:  # NOTE: on a CPU each expert's linears take the dense ones' packed form
            for layer in self.weights.layers:
                if layer.experts is not None:
                    layer.experts = layer.experts.packed(self.linear_kernel)

    @cached_property
    def router(self) -> Router:
        raise NotImplementedError

    def sparse(self, layer: int) -> bool:
        return True

    def read_experts(self, reader, layer: int) -> Experts | None:
        """The layer's router and experts, packed [E, 2I, H] / [E, H, I]: from transformers 5's
        fused tensors (``mlp.experts.gate_up_proj``) or the per-expert ones released checkpoints hold."""
        if not self.sparse(layer):
            return None
        p, block = f"model.layers.{layer}.", self.PER_EXPERT[0]
        if reader.has(p + "mlp.experts.gate_up_proj"):
            gate_up, down = reader.get(p + "mlp.experts.gate_up_proj"), reader.get(p + "mlp.experts.down_proj")
            return self._checked(Experts(reader.get(p + "mlp.gate.weight"), gate_up, down), layer)
        gate, up, down = (f"{p}{block}experts.{{}}.{name}.weight" for name in self.PER_EXPERT[1:])
        e = range(self.router.experts)
        gate_up = torch.stack([torch.cat([reader.get(gate.format(i)), reader.get(up.format(i))]) for i in e])
        down = torch.stack([reader.get(down.format(i)) for i in e])
        return self._checked(Experts(reader.get(p + block + "gate.weight"), gate_up, down), layer)

    def _checked(self, experts: Experts, layer: int) -> Experts:
        n = self.router.experts
        if experts.gate.shape[0] != n or experts.gate_up.shape[0] != n:
            raise UnsupportedModel(f"layer {layer}: the checkpoint's router scores {experts.gate.shape[0]} experts "
                                   f"({experts.gate_up.shape[0]} read), config.json says {n}")
        return experts

    def _layer_out(self, x, o, layer: LayerWeights, ops):
        if layer.experts is None:
            return super()._layer_out(x, o, layer, ops)
        o = linear(o.reshape(x.shape[0], -1), layer.o_proj, layer.o_bias)
        x, h = ops.add_rmsnorm(x, o, layer.post_norm, self.config.rms_norm_eps)
        return x, experts_forward(h, layer.experts, self.router, ops, self.fused_moe)


class Qwen3MoeModel(MoEModel, Qwen3Model):
    """Qwen3-MoE: layer i is sparse unless listed in ``mlp_only_layers``, and where
    ``(i + 1) % decoder_sparse_step == 0``; the others keep a dense MLP of ``intermediate_size``."""

    FAST_DECODE_LOOP = False

    @cached_property
    def router(self) -> Router:
        raw = self.config.raw
        return Router(expert_count(raw), raw["num_experts_per_tok"], bool(raw.get("norm_topk_prob", False)), False)

    def sparse(self, layer: int) -> bool:
        raw = self.config.raw
        step = raw.get("decoder_sparse_step", 1)
        return layer not in (raw.get("mlp_only_layers") or []) and self.router.experts > 0 and (layer + 1) % step == 0


class MixtralModel(MoEModel):
    """Mixtral: the Llama (Mistral) layer, every MLP sparse, router weights renormalised."""

    PER_EXPERT = ("block_sparse_moe.", "w1", "w3", "w2")

    @cached_property
    def router(self) -> Router:
        raw = self.config.raw
        return Router(expert_count(raw), raw["num_experts_per_tok"], renormalize=True, fp32_weights=True)
