"""A new row's extras carry every SamplingParams field the worker samples with, by name."""

from __future__ import annotations

import msgspec
import pytest

from libs.protocol.extras import COPIED, row_extras, uses_extras
from libs.protocol.messages import SamplingExtras, SamplingParams


def test_the_shared_fields_are_the_worker_side_sampling_parameters():
    assert set(COPIED) >= {"presence_penalty", "frequency_penalty", "repetition_penalty", "min_p", "min_tokens"}
    extras, params = msgspec.structs.fields(SamplingExtras), msgspec.structs.fields(SamplingParams)
    types = {f.name: (f.type, f.default) for f in params}
    assert all((f.type, f.default) == types[f.name] for f in extras if f.name in COPIED)


@pytest.mark.parametrize("field", COPIED)
def test_each_shared_field_makes_the_row_need_extras_and_travels(field):
    s = SamplingParams(max_new_tokens=8, **{field: 2})
    assert uses_extras(s)
    ex = row_extras(s, [1, 2, 3], [4])
    assert getattr(ex, field) == 2 and ex.prompt_len == 3 and ex.sample_from == 4


def test_defaults_need_no_extras():
    assert row_extras(SamplingParams(max_new_tokens=8), [1], []) is None
    assert row_extras(SamplingParams(max_new_tokens=8, logit_bias={3: 1.0}), [1], []).bias_ids == [3]
