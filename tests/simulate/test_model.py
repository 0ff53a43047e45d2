import pytest

from radixmesh.simulate.model import ServiceModel


def test_step_time_is_calibrated_decode_plus_prefill():
    m = ServiceModel()
    assert m.step_s(1, 0) == pytest.approx(0.0563)
    assert m.step_s(32, 0) == pytest.approx(0.1896)  # measured ~190 ms at batch 32
    assert m.step_s(0, 650) == pytest.approx(1.052)
    assert m.work_s(650, 100) == pytest.approx(1.43)


@pytest.mark.parametrize("kwargs", [dict(prefill_tps=0), dict(decode_base_s=-1),
                                    dict(kv_slots=0), dict(page_size=0)])
def test_bad_model_is_refused(kwargs):
    with pytest.raises(ValueError):
        ServiceModel(**kwargs)
