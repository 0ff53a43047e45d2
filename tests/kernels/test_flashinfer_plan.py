"""FlashInfer's plan arguments (libs/kernels/flashinfer_plan.py), built without flashinfer or
CUDA: the CSR layout as int32 pages of one token and HF's sliding window as ``window_left``
(FlashInfer's query at position p sees keys p - window_left .. p)."""

from __future__ import annotations

import numpy as np
import torch

from libs.kernels.flashinfer_plan import plan_args, window_left
from libs.kernels.ragged import ragged_layout
from libs.kernels.synthetic import synthetic_step


def test_window_left_is_the_keys_before_the_query_own():
    assert window_left(None) == -1 and window_left(0) == -1
    assert window_left(1) == 0  # a query sees itself alone
    assert window_left(4096) == 4095
    for window in (1, 3, 16):  # FlashInfer's visible keys against HF's mask (k > p - window)
        p = 20
        flashinfer = {k for k in range(p + 1) if k >= p - window_left(window)}
        assert flashinfer == {k for k in range(p + 1) if k > p - window}


def _layout(prefix, extend):
    step = synthetic_step(prefix, extend, num_slots=256, generator=torch.Generator().manual_seed(0))
    return step, ragged_layout(step.meta, np.arange(len(prefix)))


def test_decode_plan():
    step, lay = _layout([5, 9], [1, 1])
    args, kwargs = plan_args(lay, True, 8, 2, 64, torch.bfloat16, torch.bfloat16, 0.125, 4)
    indptr, indices, last, heads, kv_heads, head_dim, page = args
    assert indptr.dtype == indices.dtype == last.dtype == torch.int32
    assert indptr.tolist() == [0, 6, 16] and last.tolist() == [1, 1]
    rows = step.meta.rows
    assert indices.tolist() == step.meta.slot_table[rows[0], :6].tolist() + step.meta.slot_table[rows[1], :10].tolist()
    assert (heads, kv_heads, head_dim, page) == (8, 2, 64, 1)
    assert kwargs == dict(q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16, sm_scale=0.125, window_left=3)


def test_prefill_plan_is_causal_with_the_layers_window():
    _, lay = _layout([0, 30], [7, 1])
    for window, left in ((None, -1), (16, 15)):
        args, kwargs = plan_args(lay, False, 4, 4, 128, torch.float16, torch.float16, 0.1, window)
        assert args[0].tolist() == [0, 7, 8] and args[1].tolist() == [0, 7, 38]
        assert args[4:] == (4, 4, 128, 1)
        assert kwargs["causal"] is True and kwargs["window_left"] == left
