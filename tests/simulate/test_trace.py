import numpy as np
import pytest

from radixmesh.simulate.model import ServiceModel
from radixmesh.simulate.trace import TraceConfig, default_rate, make_trace

MODEL = ServiceModel()


def test_same_seed_same_trace_and_sizes():
    cfg = TraceConfig(workers=4, seed=7)
    a, b = make_trace(cfg, MODEL), make_trace(cfg, MODEL)
    assert len(a) == 80 and len(a.docs) == 16
    assert np.array_equal(a.doc_of, b.doc_of) and np.array_equal(a.arrivals, b.arrivals)
    assert all(np.array_equal(x, y) for x, y in zip(a.docs, b.docs))
    assert all(1000 <= len(d) <= 2000 for d in a.docs)
    assert all(30 <= len(q) <= 50 for q in a.questions)
    assert a.outputs.shape == (80, 64)
    other = make_trace(TraceConfig(workers=4, seed=8), MODEL)
    assert not np.array_equal(a.doc_of, other.doc_of)


def test_prompt_is_system_document_question():
    t = make_trace(TraceConfig(workers=2, system_tokens=20), MODEL)
    p = t.prompt(3)
    doc = t.docs[t.doc_of[3]]
    assert np.array_equal(p[:20], t.system)
    assert np.array_equal(p[20:20 + len(doc)], doc)
    assert np.array_equal(p[20 + len(doc):], t.questions[3])
    assert len(p) == t.prompt_len(3)


def test_documents_share_no_first_page():
    t = make_trace(TraceConfig(workers=8), MODEL)
    assert len({tuple(d[:16]) for d in t.docs}) == len(t.docs)


def test_popularity_is_zipf_like_and_arrivals_poisson():
    t = make_trace(TraceConfig(workers=16, requests=4000, zipf=1.1, rate=50.0), MODEL)
    counts = np.bincount(t.doc_of, minlength=len(t.docs))
    assert counts[0] == counts.max() and counts[0] > 5 * np.median(counts)
    gaps = np.diff(t.arrivals)
    assert np.all(gaps >= 0)
    assert 1 / 50 * 0.9 < gaps.mean() < 1 / 50 * 1.1


def test_default_rate_is_utilisation_of_perfect_caching_capacity():
    t = make_trace(TraceConfig(workers=8, utilisation=0.5), MODEL)
    used = np.unique(t.doc_of)
    prefill = sum(len(t.docs[d]) for d in used) + sum(len(q) for q in t.questions)
    work = prefill / MODEL.prefill_tps + len(t) * 63 * MODEL.decode_per_seq_s
    assert t.rate == pytest.approx(0.5 * 8 * len(t) / work)
    assert default_rate(t, MODEL) == pytest.approx(t.rate)


@pytest.mark.parametrize("kwargs", [
    dict(workers=0), dict(doc_tokens=(10, 5)), dict(question_tokens=(0, 3)),
    dict(output_tokens=0), dict(zipf=-1.0), dict(utilisation=0.0), dict(rate=-1.0),
])
def test_bad_config_is_a_clear_error(kwargs):
    with pytest.raises(ValueError):
        TraceConfig(**kwargs)


def test_request_larger_than_a_worker_is_refused():
    with pytest.raises(ValueError, match="KV slots"):
        make_trace(TraceConfig(workers=2), ServiceModel(kv_slots=1024))
