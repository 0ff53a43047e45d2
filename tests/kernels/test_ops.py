"""RMSNorm, RoPE and SiLU-mul against direct formulas."""

from __future__ import annotations

import math

import torch

from libs.kernels.ops import Rotary, apply_rope, rmsnorm, rope_inv_freq, silu_mul


def test_rmsnorm_float32_and_bfloat16():
    x, w = torch.randn(5, 32), torch.randn(32)
    ref = w * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(rmsnorm(x, w, 1e-5), ref)
    got = rmsnorm(x.bfloat16(), w.bfloat16(), 1e-5)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), ref, rtol=2e-2, atol=2e-2)


def test_silu_mul():
    gu = torch.randn(4, 10)
    g, u = gu[:, :5], gu[:, 5:]
    torch.testing.assert_close(silu_mul(gu), g * torch.sigmoid(g) * u)


def test_rope_rotates_pairs_by_position_angle():
    dim, theta = 8, 10000.0
    inv = rope_inv_freq(dim, theta)
    rot = Rotary(inv, 16)
    x = torch.randn(3, 2, dim)
    pos = torch.tensor([0, 5, 11])
    got = apply_rope(x, *rot.lookup(pos, torch.float32))
    for t, p in enumerate(pos.tolist()):
        for i in range(dim // 2):
            a = p * theta ** (-2 * i / dim)
            x1, x2 = x[t, :, i], x[t, :, i + dim // 2]
            torch.testing.assert_close(got[t, :, i], x1 * math.cos(a) - x2 * math.sin(a), rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(got[t, :, i + dim // 2], x2 * math.cos(a) + x1 * math.sin(a), rtol=1e-4, atol=1e-5)
    # position 0 is the identity; the norm of every pair is preserved
    torch.testing.assert_close(got[0], x[0])
    torch.testing.assert_close(got.norm(dim=-1), x.norm(dim=-1))


def test_partial_rope_is_hf_phi3s_bit_for_bit():
    """Partial rotary (tables narrower than the head): the first R columns rotate, the rest pass."""
    from transformers.models.phi3.modeling_phi3 import apply_rotary_pos_emb

    dim, rot = 16, 12
    table = Rotary(rope_inv_freq(rot, 10000.0), 32, attention_factor=1.1)
    q, k = torch.randn(5, 3, dim), torch.randn(5, 2, dim)
    pos = torch.tensor([0, 3, 9, 17, 31])
    cos, sin = table.lookup(pos, torch.float32)
    hf_cos, hf_sin = torch.cat((cos, cos), dim=-1)[None, :, 0], torch.cat((sin, sin), dim=-1)[None, :, 0]
    want_q, want_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], hf_cos, hf_sin)
    assert torch.equal(apply_rope(q, cos, sin), want_q[0].transpose(0, 1))
    assert torch.equal(apply_rope(k, cos, sin), want_k[0].transpose(0, 1))
    assert torch.equal(apply_rope(q, cos, sin)[..., rot:], q[..., rot:])


def test_rope_scaling_variants():
    base = rope_inv_freq(64, 500000.0)
    torch.testing.assert_close(rope_inv_freq(64, 500000.0, {"rope_type": "linear", "factor": 4.0}), base / 4)
    llama3 = rope_inv_freq(64, 500000.0, {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
    })
    assert torch.equal(llama3[:4], base[:4])  # high frequencies untouched
    torch.testing.assert_close(llama3[-1], base[-1] / 8)  # lowest frequency divided by factor
    try:
        rope_inv_freq(64, 1e4, {"rope_type": "yarn", "factor": 2.0})
    except ValueError as exc:
        assert "yarn" in str(exc)
    else:
        raise AssertionError("unsupported rope type accepted")
