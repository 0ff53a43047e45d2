import pytest

from libs.protocol import Subjects


def test_subjects_are_namespaced_and_validated():
    s = Subjects("abc")
    assert s.sched_submit("w-1") == "abc.sched.w-1.submit"
    assert s.tokenizer_detok("tok_2") == "abc.tokenizer.detok.tok_2"
    assert s.index_load_all() == "abc.index.load.*"
    for bad in ("a.b", "a b", "*", ">", ""):
        with pytest.raises(ValueError):
            s.worker_forward(bad)


def test_index_replica_subjects():
    s = Subjects("abc")
    assert (s.index_booking(), s.index_snapshot()) == ("abc.index.booking", "abc.index.snapshot")
    assert s.index_replica_route("cache_index-1") == "abc.index.replica.cache_index-1.route"
    with pytest.raises(ValueError):
        s.index_replica_route("a.b")
