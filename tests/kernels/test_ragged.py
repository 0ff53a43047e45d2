"""The CSR layout that the Triton and FlashInfer backends read."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from libs.kernels.ragged import ragged_layout
from libs.kernels.synthetic import synthetic_step


@pytest.mark.parametrize("page_size", [1, 16])
def test_subset_layout_lists_each_requests_slots_and_tokens(gen, page_size):
    prefix, extend = [4, 0, 33, 7, 0], [1, 6, 1, 3, 1]
    step = synthetic_step(prefix, extend, num_slots=512, page_size=page_size, max_requests=9, generator=gen)
    sel = np.array([1, 2, 4])
    lay = ragged_layout(step.meta, sel)
    assert lay.batch == 3 and lay.max_extend == 6 and lay.max_seq == 34
    assert lay.qo_indptr.tolist() == [0, 6, 7, 8] and lay.qo_indptr_host.tolist() == [0, 6, 7, 8]
    assert lay.kv_indptr.tolist() == [0, 6, 40, 41] and lay.kv_indptr.dtype == torch.int32
    assert lay.prefix_lens.tolist() == [0, 33, 0]
    spans = step.token_spans
    assert lay.tokens.tolist() == [t for i in sel for t in range(spans[i].start, spans[i].stop)]
    for j, i in enumerate(sel):
        got = lay.kv_indices[lay.kv_indptr_host[j] : lay.kv_indptr_host[j + 1]]
        assert torch.equal(got, step.owned[i])
    if page_size == 16:  # runs of 16 consecutive slots, page aligned
        assert bool((step.owned[2][:32].view(2, 16) % 16 == torch.arange(16)).all())


def test_synthetic_step_slots_are_disjoint_and_free_is_the_rest(gen):
    step = synthetic_step([5, 20], [3, 1], num_slots=64, page_size=16, generator=gen)
    owned = torch.cat(step.owned)
    assert len(set(owned.tolist())) == 29 and len(step.free) == 64 - 29
    assert not set(owned.tolist()) & set(step.free.tolist())
    with pytest.raises(ValueError, match="pages of 16 needed"):
        synthetic_step([60, 60], [1, 1], num_slots=64, page_size=16, generator=gen)
