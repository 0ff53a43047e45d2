"""The mixture-of-experts MLP the MoE families share (moe.py): the router's top-k, the experts'
weights packed per expert, and their grouped matmul (a CPU loop over the active experts; the
Triton fused kernel on CUDA, libs/kernels/fused_moe.py).

HF's ``modeling_qwen3_moe.py`` / ``modeling_mixtral.py`` are the reference: router logits in the
model's dtype, softmax and top-k in float32, the top-k renormalised where the model does
(Mixtral always, Qwen3-MoE under ``norm_topk_prob``), each expert's output scaled by its weight
(Qwen3-MoE rounds the weights to the model's dtype first; Mixtral keeps them float32)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from libs.kernels import ops as torch_ops

from .weights import linear, pack


@dataclass(frozen=True)
class Router:
    experts: int
    top_k: int
    renormalize: bool  # the top-k weights divided by their sum
    fp32_weights: bool  # the weights kept float32 (Mixtral), not rounded to the model's dtype

    def __call__(self, h: torch.Tensor, gate: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, top_k], experts [T, top_k] int64) of the tokens ``h`` [T, H]; ``gate`` [E, H]."""
        probs = torch.softmax(F.linear(h, gate), dim=-1, dtype=torch.float32)
        weights, ids = probs.topk(self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return (weights if self.fp32_weights else weights.to(h.dtype)), ids


@dataclass(frozen=True)
class Experts:
    """A sparse layer's router and experts: plain [E, 2I, H] / [E, H, I] tensors, or (on a CPU
    with packed linears) one packed weight per expert (weights.pack)."""

    gate: torch.Tensor  # [E, H] router
    gate_up: torch.Tensor | list  # [E, 2I, H]: each expert's gate rows, then its up rows
    down: torch.Tensor | list  # [E, H, I]

    def packed(self, kernel: str) -> "Experts":
        return replace(self, gate_up=[pack(w, kernel) for w in self.gate_up], down=[pack(w, kernel) for w in self.down])


def experts_forward(h: torch.Tensor, experts: Experts, router: Router, ops, fused: bool = False) -> torch.Tensor:
    """The MoE MLP's output for the normed tokens ``h`` [T, H] (not yet added to the residual);
    through the Triton kernel on CUDA, or where ``fused`` (plain expert weights)."""
    weights, ids = router(h, experts.gate)
    if h.is_cuda or fused:
        from libs.kernels.fused_moe import fused_experts

        return fused_experts(h, experts.gate_up, experts.down, weights, ids, ops.silu_mul)
    if torch.compiler.is_compiling():  # NOTE: a compiled step's weights are plain (compiled.py)
        return _grouped_op(h, experts.gate_up, experts.down, weights, ids)
    return grouped_experts(h, experts.gate_up, experts.down, weights, ids, ops.silu_mul)


def grouped_experts(x: torch.Tensor, gate_up, down, weights: torch.Tensor, ids: torch.Tensor,
                    silu_mul) -> torch.Tensor:
    """``sum_k weights[t, k] * expert_{ids[t, k]}(x[t])`` on a CPU: the (token, choice) pairs
    sorted by expert, one gate_up and one down matmul per active expert over its rows."""
    top = ids.shape[1]
    flat = ids.reshape(-1)
    order = flat.argsort(stable=True)
    rows = x.index_select(0, order // top)
    out, start = torch.empty_like(rows), 0
    for e, n in enumerate(torch.bincount(flat, minlength=len(gate_up)).tolist()):  # NOTE: a CPU reads it for free
        if n:
            out[start:start + n] = linear(silu_mul(linear(rows[start:start + n], gate_up[e])), down[e])
            start += n
    scaled = (out * weights.reshape(-1)[order, None]).to(x.dtype)
    return torch.zeros_like(x).index_add_(0, order // top, scaled)


# NOTE: the per-expert row counts are data: opaque to a compiled step's full graph as a custom op
@torch.library.custom_op("radixmesh::grouped_experts", mutates_args=())
def _grouped_op(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, weights: torch.Tensor,
                ids: torch.Tensor) -> torch.Tensor:
    return grouped_experts(x, gate_up, down, weights, ids, torch_ops.silu_mul)


@_grouped_op.register_fake
def _(x, gate_up, down, weights, ids):
    return torch.empty_like(x)
