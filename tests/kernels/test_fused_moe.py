"""The Triton fused MoE kernel (interpreter on a CPU, compiled on CUDA) against a naive loop over
(token, choice) pairs; its routing sort on its own."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from libs.kernels import ops  # noqa: E402
from libs.kernels.fused_moe import BLOCK_M, align, fused_experts  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def naive(x, gate_up, down, weights, ids):
    """One token and one choice at a time, in float64."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    x, gate_up, down = x.double().cpu(), gate_up.double().cpu(), down.double().cpu()
    for t in range(ids.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            gate, up = (gate_up[e] @ x[t]).chunk(2)
            out[t] += float(weights[t, k]) * (down[e] @ (torch.nn.functional.silu(gate) * up))
    return out


def _case(gen, tokens, experts, top, hidden, inter, dtype):
    x = torch.randn(tokens, hidden, generator=gen).to(DEVICE, dtype)
    gate_up = (torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden**0.5).to(DEVICE, dtype)
    down = (torch.randn(experts, hidden, inter, generator=gen) / inter**0.5).to(DEVICE, dtype)
    ids = torch.rand(tokens, experts, generator=gen).argsort(-1)[:, :top].to(DEVICE)  # distinct per token
    weights = torch.rand(tokens, top, generator=gen).to(DEVICE)
    return x, gate_up, down, weights, ids


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens,experts,top,hidden,inter", [(1, 4, 2, 32, 16), (37, 8, 2, 48, 40), (20, 6, 3, 80, 24)],
                         ids=["decode", "prefill", "top3-odd-widths"])
def test_fused_experts_match_a_naive_loop(gen, dtype, tokens, experts, top, hidden, inter):
    x, gate_up, down, weights, ids = _case(gen, tokens, experts, top, hidden, inter, dtype)
    got = fused_experts(x, gate_up, down, weights, ids, ops.silu_mul)
    ref = naive(x, gate_up, down, weights, ids)
    assert got.dtype == dtype and got.shape == x.shape
    err = float((got.cpu().double() - ref).abs().max() / ref.abs().max())
    assert err <= TOL[dtype], f"relative error {err:.2e}"


def test_align_sorts_pairs_by_expert_in_whole_blocks(gen):
    ids = torch.tensor([[3, 0], [3, 1], [0, 3]], device=DEVICE)  # expert 2 unused
    pairs, block_expert, total = align(ids, 4, block=4)
    assert int(total) == 12  # experts 0, 1, 3: one block each
    assert pairs[:12].tolist() == [1, 4, 6, 6, 3, 6, 6, 6, 0, 2, 5, 6]  # pair t * 2 + k; 6 pads
    assert block_expert[:3].tolist() == [0, 1, 3]
    assert pairs.numel() >= 6 + 4 * 3 and pairs.numel() % 4 == 0  # room for any routing
    assert BLOCK_M >= 16  # tl.dot's smallest tile


@pytest.mark.slow  # the interpreter runs the attention and expert kernels of every step
def test_a_moe_model_through_the_fused_kernel_matches_hf(tmp_path):
    """Qwen3-MoE on the Triton backend with its experts through fused_experts (on a CPU: the
    interpreter, the model told to take the kernel): greedy tokens identical to HF fp32."""
    from services.gpu_worker import ModelRunner, RunnerConfig
    from tests.gpu_worker.models.checkpoints import write
    from tests.gpu_worker.models.greedy import Slots, generate, hf_greedy

    hf = write("qwen3_moe", tmp_path)
    prompts = [torch.randint(3, 300, (n,), generator=torch.Generator().manual_seed(1)).tolist() for n in (11, 5)]
    refs = [hf_greedy(hf, p, 4) for p in prompts]
    assert min(gap for _, gap in refs) > 1e-4
    runner = ModelRunner(RunnerConfig(model=str(tmp_path), attention_backend="triton", kv_slots=128, max_requests=2,
                                      device=DEVICE, dtype="float32", pack_weights=False))
    runner.model.fused_moe = True
    outs, _ = generate(runner, prompts, 4, Slots(128))
    assert outs == [tokens for tokens, _ in refs]
