"""One attention check shared by the backend tests: a random paged step against a float64 reference.

Every check draws fresh inputs from the test's generator (see the ``gen``
fixture, which prints its seed), fills the pool with stale data, poisons every
slot the step does not own with NaN (attention must never read them) and the
output with NaN (every element must be written). Under sliding windows (``Case.windows``)
the V rows no query of a request sees hold 1e4, so any weight on them shows (NaN would not
reliably: the C++ kernels are built with -ffast-math, and may read V rows they weigh 0).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from libs.kernels import AttentionBackend, KVPool
from libs.kernels.synthetic import synthetic_step

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


@dataclass(frozen=True)
class Case:
    prefix_lens: list[int]
    extend_lens: list[int]
    kv_heads: int = 2
    group: int = 1
    head_dim: int = 64
    dtype: torch.dtype = torch.float32
    page_size: int = 1
    layers: int = 1
    kv_dtype: torch.dtype | None = None  # the pool's (None: ``dtype``); the backend gets ``dtype`` queries
    windows: tuple[int | None, ...] = ()  # per layer (set_windows): the keys a query sees at most; None: all

    def window(self, layer: int) -> int | None:
        return self.windows[layer] if layer < len(self.windows) else None

    @property
    def pool_dtype(self) -> torch.dtype:
        return self.dtype if self.kv_dtype is None else self.kv_dtype


def random_lens(gen: torch.Generator, batch: int, max_prefix: int, max_extend: int) -> tuple[list[int], list[int]]:
    """Ragged lengths with a fresh prefill (prefix 0), a long prefix, decode rows and extend rows."""
    prefix = torch.randint(0, max_prefix + 1, (batch,), generator=gen).tolist()
    extend = torch.randint(1, max_extend + 1, (batch,), generator=gen).tolist()
    prefix[0], extend[0] = 0, max_extend  # prefill without a prefix
    prefix[-1], extend[-1] = max_prefix, 1  # decode after the longest prefix
    if batch > 2:
        extend[1] = 1 if extend[1] > 1 else 2  # ensure both kinds whatever the draw
    return prefix, extend


def reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, prefix: int, scale: float,
              window: int | None = None) -> torch.Tensor:
    """Causal GQA attention in float64 of ``q`` [n, H, D] over ``keys``/``values`` [prefix + n, Hkv, D]
    (under a window, query i sees keys prefix + i - window + 1 .. prefix + i only: HF's mask)."""
    n, heads = q.shape[:2]
    group = heads // keys.shape[1]
    k = keys.double().repeat_interleave(group, dim=1)
    v = values.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    pos_k = torch.arange(keys.shape[0], device=q.device)
    pos_q = prefix + torch.arange(n, device=q.device)
    hidden = pos_k[None, :] > pos_q[:, None]
    if window:
        hidden |= pos_k[None, :] <= pos_q[:, None] - window
    scores = scores.masked_fill(hidden[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def check_attention(
    make_backend: Callable[[KVPool], AttentionBackend], case: Case, gen: torch.Generator, device: str = "cpu",
) -> float:
    """Run ``case`` through a fresh backend; assert stores, coverage and accuracy; return the worst relative error.
    The reference reads K/V as the pool holds them: attention over a bf16 pool under fp32
    queries is held to fp32's tolerance, new tokens' K/V included (rounded as stored)."""
    seq = [p + e for p, e in zip(case.prefix_lens, case.extend_lens)]
    pages = sum(-(-n // case.page_size) for n in seq)
    pool = KVPool(case.layers, 2 * pages * case.page_size + 64, case.kv_heads, case.head_dim, case.pool_dtype, device)
    step = synthetic_step(
        case.prefix_lens, case.extend_lens, num_slots=pool.num_slots, page_size=case.page_size,
        max_requests=len(seq) + 3, generator=gen, device=device,
    )
    for t in pool.k + pool.v:
        t.copy_(_randn(t.shape, gen, case.pool_dtype, device) * 3)
        t[step.free] = float("nan")
    backend = make_backend(pool)
    if case.windows:
        backend.set_windows(case.windows)
        _loud_hidden_values(pool, case, step.owned)
    backend.prepare(step.meta)
    heads, tokens = case.kv_heads * case.group, step.meta.num_tokens
    worst = 0.0
    for layer in range(case.layers):
        q = _randn((tokens, heads, case.head_dim), gen, case.dtype, device)
        k = _randn((tokens, case.kv_heads, case.head_dim), gen, case.dtype, device)
        v = _randn((tokens, case.kv_heads, case.head_dim), gen, case.dtype, device)
        out = torch.full_like(q, float("nan"))
        assert backend.forward(layer, q, k, v, out=out) is out
        slots = step.meta.out_slots
        stored = (pool.k[layer][slots], pool.v[layer][slots])
        assert all(torch.equal(s, x.to(pool.dtype)) for s, x in zip(stored, (k, v))), "new K/V not stored"
        assert not out.isnan().any(), f"{int(out.isnan().any(-1).any(-1).sum())} token rows left unwritten"
        for i, span in enumerate(step.token_spans):
            owned = step.owned[i]
            ref = reference(q[span], pool.k[layer][owned], pool.v[layer][owned], case.prefix_lens[i], backend.scale,
                            case.window(layer))
            err = float((out[span].double() - ref).abs().max() / ref.abs().max())
            assert err <= TOLERANCE[case.dtype], (
                f"request {i} (prefix {case.prefix_lens[i]}, extend {case.extend_lens[i]}): relative error {err:.2e}"
            )
            worst = max(worst, err)
    return worst


def _loud_hidden_values(pool: KVPool, case: Case, owned: list[torch.Tensor]) -> None:
    """1e4 in the V rows of each request's keys that no query of it sees under its layer's window."""
    for layer in range(case.layers):
        if window := case.window(layer):
            for prefix, slots in zip(case.prefix_lens, owned):
                pool.v[layer][slots[: max(0, prefix + 1 - window)]] = 1e4


def _randn(shape, gen: torch.Generator, dtype: torch.dtype, device: str) -> torch.Tensor:
    return torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
