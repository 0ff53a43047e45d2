"""The CPU greedy pick (numpy's argmax) is torch.argmax exactly: ties, NaN, dtypes."""

import numpy as np
import torch

from services.gpu_worker.sampling.sampler import greedy


def test_greedy_equals_torch_argmax_on_ties_nan_and_every_dtype():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randint(0, 4, (64, 1000), generator=gen).float()  # many ties per row
    logits[3, 17] = float("nan")
    logits[5, :] = -float("inf")
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = logits.to(dtype)
        got = greedy(x)
        assert got.dtype == torch.int64
        assert torch.equal(got, x.argmax(dim=-1)), dtype
    assert greedy(logits[:, ::2]).tolist() == logits[:, ::2].argmax(-1).tolist()  # strided


def test_greedy_picks_the_first_of_equal_maxima():
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0], [np.nan, 5.0, np.nan, 1.0]])
    assert greedy(x).tolist() == [1, 0]
