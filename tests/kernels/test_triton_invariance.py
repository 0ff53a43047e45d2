"""The Triton backend's deterministic mode, bit for bit (the interpreter on a CPU, compiled on CUDA):
a row of the invariant matmul is the same whatever the number of rows around it, and a token's
attention output is the same in a prefill chunk, an extend over a cached prefix, a decode step
and a batch with other requests. Each test also runs the path it replaces (another K tiling;
the backend's default kernels) and shows it differs, so the equalities can fail."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from libs.kernels import KVPool  # noqa: E402
from libs.kernels.base import AttentionMetadata  # noqa: E402
from libs.kernels.triton_backend import TritonAttentionBackend  # noqa: E402
from libs.kernels.triton_matmul import linear  # noqa: E402

from .attention_case import Case, check_attention  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_an_invariant_linear_row_is_the_same_bits_in_any_batch(gen, dtype):
    n, k = 80, 200  # NOTE: neither a multiple of the tiles (64): the edge blocks are masked
    w = torch.randn(n, k, generator=gen).to(DEVICE, dtype)
    bias = torch.randn(n, generator=gen).to(DEVICE, dtype)
    x = torch.randn(64, k, generator=gen).to(DEVICE, dtype)
    whole = linear(x, w, bias)
    ref = torch.nn.functional.linear(x.double(), w.double(), bias.double())
    assert float((whole.double() - ref).abs().max() / ref.abs().max()) < (1e-5 if dtype == torch.float32 else 1e-2)
    for m in (1, 3, 17, 64):
        assert torch.equal(linear(x[:m], w, bias), whole[:m]), m
    assert torch.equal(linear(x[17:18], w, bias), whole[17:18])  # another place in its block
    # the same kernel tiling K otherwise (as a tile choice that follows M would) is another sum:
    # seen in fp32 rows (NOTE: at these sizes bf16's rounding of the sum hides most reorderings)
    x32, w32 = x.float(), w.float()
    assert not torch.equal(linear(x32, w32, block_k=32), linear(x32, w32))


def test_the_deterministic_linear_form_on_cuda_runs_the_invariant_matmul(gen):
    """weights.py's ``triton-fixed`` form (what --deterministic packs on CUDA) goes through it."""
    from services.gpu_worker.models import weights

    w = torch.randn(70, 96, generator=gen).to(DEVICE, torch.bfloat16)
    x = torch.randn(5, 96, generator=gen).to(DEVICE, torch.bfloat16)
    packed = weights.pack(w, weights.TRITON_FIXED)
    assert packed.shape == (70, 96)
    assert torch.equal(weights.linear(x, packed), linear(x, w))


# -- attention -------------------------------------------------------------------------
#
# Request 0 (the one compared) has L tokens; its K/V and queries are fixed per position, so
# every way of computing a token stores the same K/V in the same slots and reads the same keys.

L, KV_HEADS, GROUP, DIM = 33, 2, 3, 64  # NOTE: tokens 25..32 of request 0: three key splits of 16
OTHERS = [(0, 23), (60, 1), (37, 9)]  # other requests of a batch: (prefix, extend)


class Seq:
    """Pool, slot table and per-position tensors of request 0 and the batch's others."""

    def __init__(self, gen: torch.Generator, dtype: torch.dtype) -> None:
        lens = [L] + [p + e for p, e in OTHERS]
        self.pool = KVPool(1, 2 * sum(lens) + 16, KV_HEADS, DIM, dtype, DEVICE)
        for t in self.pool.k + self.pool.v:
            t.copy_(torch.randn(t.shape, generator=gen).to(DEVICE, dtype))
        perm = torch.randperm(self.pool.num_slots, generator=gen)
        self.table = torch.zeros(len(lens) + 1, max(lens), dtype=torch.int64)
        self.q, self.k, self.v, used = [], [], [], 0
        for r, n in enumerate(lens):  # NOTE: request r on table row r + 1 (row 0 unused)
            self.table[r + 1, :n] = perm[used: used + n]
            used += n
            self.q.append(torch.randn(n, KV_HEADS * GROUP, DIM, generator=gen).to(DEVICE, dtype))
            self.k.append(torch.randn(n, KV_HEADS, DIM, generator=gen).to(DEVICE, dtype))
            self.v.append(torch.randn(n, KV_HEADS, DIM, generator=gen).to(DEVICE, dtype))
        self.table = self.table.to(DEVICE)

    def run(self, backend, spans: list[tuple[int, int, int]]) -> list[torch.Tensor]:
        """One step of ``spans`` (request, prefix, extend); each request's output rows."""
        rows = [r + 1 for r, _, _ in spans]
        pick = lambda ts: torch.cat([ts[r][p: p + e] for r, p, e in spans])  # noqa: E731
        meta = AttentionMetadata(
            rows=torch.tensor(rows, device=DEVICE), prefix_lens=np.array([p for _, p, _ in spans], dtype=np.int64),
            extend_lens=np.array([e for _, _, e in spans], dtype=np.int64),
            out_slots=torch.cat([self.table[r + 1, p: p + e] for r, p, e in spans]), slot_table=self.table,
        )
        backend.prepare(meta)
        out = backend.forward(0, pick(self.q), pick(self.k), pick(self.v))
        return list(out.split([e for _, _, e in spans]))


def _ways(seq: Seq, backend) -> dict[str, torch.Tensor]:
    """Request 0's tokens 25 .. L-1, computed four ways."""
    ways = {"prefill": seq.run(backend, [(0, 0, L)])[0][25:],
            "extend": seq.run(backend, [(0, 25, L - 25)])[0],
            "decode": torch.cat([seq.run(backend, [(0, p, 1)])[0] for p in range(25, L)])}
    batch = [(r + 1, p, e) for r, (p, e) in enumerate(OTHERS)]
    ways["batch"] = seq.run(backend, batch[:2] + [(0, 10, L - 10)] + batch[2:])[2][15:]
    return ways


def _backend(pool: KVPool, deterministic: bool, window: int | None = None) -> TritonAttentionBackend:
    backend = TritonAttentionBackend(pool, block_m=16, block_n=16, min_split_len=16, split_keys=16)
    backend.set_windows((window,))
    backend.set_deterministic(deterministic)
    return backend


@pytest.mark.parametrize("dtype, window", [(torch.bfloat16, None), (torch.bfloat16, 12), (torch.float16, None)])
def test_deterministic_attention_gives_a_token_the_same_bits_every_way(gen, dtype, window):
    seq = Seq(gen, dtype)
    ways = _ways(seq, _backend(seq.pool, True, window))
    for name, rows in ways.items():
        assert torch.equal(rows, ways["decode"]), name
    # the default kernels: the extend kernel's tiles, decode splits that follow the batch's longest
    default = _ways(seq, _backend(seq.pool, False, window))
    assert not all(torch.equal(rows, default["decode"]) for rows in default.values())


def test_a_step_split_into_launches_gives_the_same_bits(gen, monkeypatch):
    """A long step runs its queries in several launches (scratch bounded): the bits do not move."""
    from libs.kernels import triton_invariant

    seq = Seq(gen, torch.bfloat16)
    backend = _backend(seq.pool, True)
    spans = [(1, 0, 23), (0, 0, L), (2, 60, 1)]
    whole = seq.run(backend, spans)
    monkeypatch.setattr(triton_invariant, "SCRATCH_BYTES", 4 * 6 * 4 * 65 * 7)  # 7 queries a launch
    assert triton_invariant.queries_per_launch(6, 4, 64) == 7
    for a, b in zip(seq.run(backend, spans), whole):
        assert torch.equal(a, b)


@pytest.mark.parametrize("windows", [(None,), (5, None)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_deterministic_attention_against_the_reference(gen, dtype, windows):
    """Accurate too: prefill, extend and decode rows, long enough for several splits, windows
    shorter than a split and none (attention_case's check: NaN in unowned slots, every row written)."""
    case = Case([0, 30, 70, 5], [33, 12, 1, 1], kv_heads=2, group=3, dtype=dtype, layers=len(windows),
                windows=windows)

    def make(pool):
        backend = TritonAttentionBackend(pool, block_n=16, split_keys=32)
        backend.set_deterministic(True)
        return backend

    check_attention(make, case, gen, DEVICE)
