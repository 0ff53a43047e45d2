"""Phi-3 / Phi-3.5 / Phi-4 / Phi-4-mini (``Phi3ForCausalLM``): the Llama layer with q, k, v and
gate, up fused in the checkpoint (``qkv_proj``, ``gate_up_proj``), partial rotary (Phi-4-mini
rotates 0.75 of each head; the rope kernels take it from the tables' width) and longrope
(layers.py: one factor set per served context)."""

from __future__ import annotations

from .llama import LlamaModel
from .weights import FUSED_NAMES


class Phi3Model(LlamaModel):
    # HF's Phi-3 takes rope types default and longrope only (its "su" / "yarn" mean longrope:
    # refused by name rather than read as Llama's yarn)
    FEATURES = frozenset({"act:silu", "sliding_window", "partial_rotary", "rope:default", "rope:longrope"})
    WEIGHT_NAMES = FUSED_NAMES
    # NOTE: the layer is Llama's, and the C++ loop's RoPE is the same rope_qk_ kernel (partial
    # rotary included): bit for bit (tests/gpu_worker/models/test_layer_loop.py)
    FAST_DECODE_LOOP = True
