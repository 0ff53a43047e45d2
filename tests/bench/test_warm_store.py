from radixmesh.bench.warm_store import openers
from radixmesh.bench.workloads import build_workload


def test_the_store_is_primed_with_one_request_per_document(chat_tok):
    w = build_workload("tiered-docs-zipf", chat_tok, seed=1,
                       overrides={"docs": "5", "doc_tokens": "80", "requests": "20"})
    first = openers(w)
    asked = list(dict.fromkeys(s.id.split("-")[0] for s in w.requests))
    assert [s.id.split("-")[0] for s in first] == asked  # each asked document once, in order
    assert [s.id for s in first] == [next(r.id for r in w.requests if r.id.startswith(d + "-")) for d in asked]
    handbook = build_workload("handbook", chat_tok, seed=0, quick=True)
    assert len(openers(handbook)) == 1  # one document behind every reader
