from radixmesh.bench.pd_mix import DOCUMENT, STREAM
from radixmesh.bench.tokens import common_prefix
from radixmesh.bench.workloads import build_workload


def test_lanes_keep_streams_decoding_one_after_another(chat_tok):
    w = build_workload("pd-mix", chat_tok, seed=0, overrides={
        "streams": "3", "stream_rounds": "2", "docs": "2", "doc_tokens": "200"})
    streams = [s for s in w.requests if s.kind == STREAM]
    assert len(streams) == 6 and all(s.max_tokens >= 128 for s in streams)
    by_id = {s.id: s for s in streams}
    assert [by_id[f"stream{i}-r0"].arrive_s for i in range(3)] == [0.0, 0.7, 1.4]
    assert by_id["stream2-r1"].after == ("stream2-r0",) and by_id["stream2-r1"].arrive_s is None
    assert not any(s.depends_on for s in w.requests)  # no answer is embedded
    assert [s.id for s in w.roots] == ["stream0-r0", "stream1-r0", "stream2-r0", "doc0", "doc1"]


def test_documents_are_long_distinct_and_keep_arriving(chat_tok):
    w = build_workload("pd-mix", chat_tok, seed=0, overrides={"docs": "3", "stream_rounds": "1"})
    docs = [s for s in w.requests if s.kind == DOCUMENT]
    assert [d.arrive_s for d in docs] == [2.0, 8.0, 14.0]
    assert all(d.max_tokens <= 8 for d in docs)
    ids = [chat_tok.prompt_ids(d.render({})) for d in docs]
    assert all(1400 <= len(x) <= 1700 for x in ids), [len(x) for x in ids]
    assert max(common_prefix(a, b) for i, a in enumerate(ids) for b in ids[i + 1:]) < 40
    assert 1400 <= w.info["doc_prompt_tokens_mean"] <= 1700
    assert w.info["stream_prompt_tokens_mean"] < 200
    assert (w.info["streams"], w.info["documents"], w.info["last_doc_arrival_s"]) == (4, 3, 14.0)
