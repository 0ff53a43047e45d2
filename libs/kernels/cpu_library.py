"""The C++ elementwise kernels as torch custom ops (``torch.ops.radixmesh.*``, defined in
``csrc/module.cpp``), with the fake kernels torch.compile traces them by, so a compiled
graph (fullgraph) can call them instead of inductor's own loops.

Schemas (``Tensor(a!)``: written in place)::

    rmsnorm(Tensor x, Tensor weight, float eps) -> Tensor
    add_rmsnorm_(Tensor(a!) x, Tensor(b!) h, Tensor weight, float eps) -> ()
    silu_mul(Tensor gate_up) -> Tensor
    rope_qk_(Tensor(a!) qkv, Tensor positions, Tensor cos, Tensor sin, int heads, int head_dim) -> ()
"""

from __future__ import annotations

import functools

import torch

from . import cpu_ext


@functools.cache
def load():
    """``torch.ops.radixmesh`` after the module is loaded and the fakes registered (once);
    raises BackendNotAvailable if the C++ module cannot build."""
    # NOTE: the process's own level (a test's cpu_ext.using() aside): ops are registered once
    cpu_ext.load(cpu_ext.loaded_level()).register_ops()
    torch.library.register_fake("radixmesh::rmsnorm")(_fake_rmsnorm)
    torch.library.register_fake("radixmesh::add_rmsnorm_")(_fake_in_place)
    torch.library.register_fake("radixmesh::silu_mul")(_fake_silu_mul)
    torch.library.register_fake("radixmesh::rope_qk_")(_fake_in_place)
    return torch.ops.radixmesh


def _fake_rmsnorm(x, weight, eps):
    return torch.empty_like(x)


def _fake_silu_mul(gate_up):
    return gate_up.new_empty(gate_up.shape[0], gate_up.shape[1] // 2)


def _fake_in_place(*args):
    return None


# -- the piece ops of a compiled step on these custom ops (the names and signatures of
#    :mod:`.ops`, so a model piece takes this module as its ``ops``) ---------------------

def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.ops.radixmesh.rmsnorm(x, weight, eps)


def add_rmsnorm(x: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, eps: float):
    """``x <- x + h``, ``h <- rmsnorm(x)``, in place; returns ``(x, h)``."""
    torch.ops.radixmesh.add_rmsnorm_(x, h, weight, eps)
    return x, h


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    return torch.ops.radixmesh.silu_mul(gate_up)


def rope_cache(rotary, positions: torch.Tensor, dtype: torch.dtype):
    """The kernel's own inputs: the positions and the model's fp32 tables (looked up inside)."""
    return positions.to(torch.int64).contiguous(), rotary.cos, rotary.sin


def rope_qk(qkv: torch.Tensor, heads: int, head_dim: int, rope) -> torch.Tensor:
    torch.ops.radixmesh.rope_qk_(qkv, *rope, heads, head_dim)
    return qkv[:, : heads * head_dim].view(qkv.shape[0], heads, head_dim)
