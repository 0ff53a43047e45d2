"""The MoE layer's pieces: the router against HF's (Qwen3-MoE's and Mixtral's), the CPU grouped
matmul against a naive per-expert loop (plain and packed weights, fp32 and bf16), a sparse block
against HF's in bf16, and loading transformers 5's fused expert tensors like the per-expert ones."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from libs.kernels import gemm
from libs.kernels import ops
from services.gpu_worker.models.features import UnsupportedModel
from services.gpu_worker.models.moe_layer import Experts, Router, experts_forward, grouped_experts
from services.gpu_worker.models.registry import load_model
from services.gpu_worker.models.weights import can_pack, pack

from .checkpoints import edit_config, hf_config, write

CPU = torch.device("cpu")
KERNELS = ["plain"] + (["onednn"] if can_pack(torch.bfloat16, CPU) else []) + (["tiles"] if gemm.available() else [])


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(7)


def _hf_router(arch: str, dtype, **overrides):
    from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    module = {"qwen3_moe": Qwen3MoeTopKRouter, "mixtral": MixtralTopKRouter}[arch](hf_config(arch, **overrides))
    with torch.no_grad():
        module.weight.copy_(torch.randn(module.weight.shape, generator=_gen()))
    return module.to(dtype)


ROUTERS = [("qwen3_moe", {"norm_topk_prob": True}, Router(8, 2, True, False)),
           ("qwen3_moe", {"norm_topk_prob": False}, Router(8, 2, False, False)),
           ("mixtral", {}, Router(4, 2, True, True))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("arch,overrides,router", ROUTERS, ids=["qwen3-moe-norm", "qwen3-moe", "mixtral"])
def test_router_matches_hf(arch, overrides, router, dtype):
    hf = _hf_router(arch, dtype, **overrides)
    h = torch.randn(33, 96, generator=_gen()).to(dtype)
    with torch.no_grad():
        _, ref_weights, ref_ids = hf(h)
    weights, ids = router(h, hf.weight.detach())
    assert torch.equal(ids, ref_ids)
    assert weights.dtype == ref_weights.dtype and torch.equal(weights, ref_weights)  # the dtype HF keeps them in


def naive(x, gate_up, down, weights, ids):
    """Expert by expert over the tokens routed to it (HF's loop), in float64."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    for e in range(gate_up.shape[0]):
        token, choice = torch.where(ids == e)
        gate, up = (x[token].double() @ gate_up[e].double().T).chunk(2, dim=-1)
        expert = (torch.nn.functional.silu(gate) * up) @ down[e].double().T
        out.index_add_(0, token, weights[token, choice, None].double() * expert)
    return out


def _experts(tokens, experts, top, dtype, hidden=64, inter=48):
    g = _gen()
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    gate_up = (torch.randn(experts, 2 * inter, hidden, generator=g) / hidden**0.5).to(dtype)
    down = (torch.randn(experts, hidden, inter, generator=g) / inter**0.5).to(dtype)
    ids = torch.rand(tokens, experts, generator=g).argsort(-1)[:, :top]
    weights = torch.rand(tokens, top, generator=g)
    return x, gate_up, down, weights, ids


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens,experts,top", [(1, 8, 2), (45, 8, 2), (30, 16, 4)], ids=["decode", "prefill", "top4"])
def test_grouped_matmul_matches_a_naive_per_expert_loop(tokens, experts, top, dtype, kernel):
    if kernel == "tiles" and dtype == torch.float32 and not gemm.f32_available():
        pytest.skip("no fp32 tiles kernel here")
    x, gate_up, down, weights, ids = _experts(tokens, experts, top, dtype)
    ref = naive(x, gate_up, down, weights, ids)
    if kernel != "plain":
        gate_up, down = [pack(w, kernel) for w in gate_up], [pack(w, kernel) for w in down]
    got = grouped_experts(x, gate_up, down, weights, ids, ops.silu_mul)
    assert got.dtype == dtype and got.shape == x.shape
    # NOTE: tiles under fp32 activations round the weights to bf16
    tol = 1e-5 if dtype == torch.float32 and kernel != "tiles" else 2e-2
    err = float((got.double() - ref).abs().max() / ref.abs().max())
    assert err <= tol, f"relative error {err:.2e}"


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])
def test_a_sparse_block_in_bf16_matches_hf(tmp_path, arch):
    hf = write(arch, tmp_path).to(torch.bfloat16)
    model = load_model(tmp_path, dtype=torch.bfloat16)  # packed as served
    h = torch.randn(20, 96, generator=_gen()).to(torch.bfloat16)
    with torch.no_grad():
        ref = hf.model.layers[1].mlp(h[None])[0].double()
    got = experts_forward(h, model.weights.layers[1].experts, model.router, ops).double()
    assert float((got - ref).abs().max() / ref.abs().max()) < 2e-2


def _fuse(path, arch):
    """Rewrite the checkpoint's per-expert tensors as transformers 5's fused ones (``mlp.experts.gate_up_proj``)."""
    block, gate, up, down = {"qwen3_moe": ("mlp", "gate_proj", "up_proj", "down_proj"),
                             "mixtral": ("block_sparse_moe", "w1", "w3", "w2")}[arch]
    tensors = load_file(path / "model.safetensors")
    for i in range(2):
        p = f"model.layers.{i}."
        n = sum(1 for name in tensors if name.startswith(f"{p}{block}.experts.") and name.endswith(f".{gate}.weight"))
        per = {w: [tensors.pop(f"{p}{block}.experts.{e}.{w}.weight") for e in range(n)] for w in (gate, up, down)}
        tensors[f"{p}mlp.experts.gate_up_proj"] = torch.stack([torch.cat([g, u]) for g, u in zip(per[gate], per[up])])
        tensors[f"{p}mlp.experts.down_proj"] = torch.stack(per[down])
        tensors[f"{p}mlp.gate.weight"] = tensors.pop(f"{p}{block}.gate.weight")
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])
def test_fused_expert_tensors_load_like_per_expert_ones(tmp_path, arch):
    write(arch, tmp_path)
    per_expert = load_model(tmp_path, pack=False).weights.layers[1].experts
    _fuse(tmp_path, arch)
    fused = load_model(tmp_path, pack=False).weights.layers[1].experts
    assert isinstance(fused, Experts)
    for name in ("gate", "gate_up", "down"):
        assert torch.equal(getattr(fused, name), getattr(per_expert, name))


def test_an_expert_count_unlike_the_config_is_refused(tmp_path):
    write("mixtral", tmp_path)
    edit_config(tmp_path, lambda c: c.update(num_local_experts=3))
    with pytest.raises(UnsupportedModel, match="layer 0: the checkpoint's router scores 4 experts"):
        load_model(tmp_path)


@pytest.mark.slow  # one small compile: inductor on 2 cores
def test_a_compiled_step_runs_the_experts_as_an_opaque_op(tmp_path):
    """A compiled step traces its pieces as one full graph: the experts' data-dependent row
    counts stay inside a custom op, and greedy tokens are HF's."""
    from services.gpu_worker import ModelRunner, RunnerConfig

    from .greedy import Slots, generate, hf_greedy

    hf = write("qwen3_moe", tmp_path)
    prompts = [torch.randint(3, 300, (n,), generator=torch.Generator().manual_seed(1)).tolist() for n in (13, 6)]
    refs = [hf_greedy(hf, p, 4) for p in prompts]
    assert min(gap for _, gap in refs) > 1e-4
    runner = ModelRunner(RunnerConfig(model=str(tmp_path), kv_slots=256, max_requests=2, dtype="float32",
                                      compile=True, compile_sizes=(2, 32)))
    outs, _ = generate(runner, prompts, 4, Slots(256))
    assert outs == [tokens for tokens, _ in refs]


def test_the_fp32_copy_check_counts_the_experts(tmp_path):
    """tiles+onednn's fp32 copy is taken only where it fits: the experts are most of a MoE's weights."""
    from services.gpu_worker.models.weights import fp32_copy_fits

    write("qwen3_moe", tmp_path)
    w = load_model(tmp_path, pack=False).weights
    experts = sum(t.numel() for layer in w.layers for t in (layer.experts.gate_up, layer.experts.down))
    dense = sum(t.numel() for layer in w.layers for t in (layer.qkv, layer.o_proj)) + w.lm_head.numel()
    assert fp32_copy_fits(w, share=1.0, available=(dense + experts) * 4)
    assert not fp32_copy_fits(w, share=1.0, available=(dense + experts) * 4 - 1)
