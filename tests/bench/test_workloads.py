import numpy as np
import pytest

from radixmesh.bench.tokens import common_prefix
from radixmesh.bench.workload import Answer, Message, RequestSpec, Workload
from radixmesh.bench.workloads import WORKLOADS, access_order, build_workload


def _ids(tok, workload, answers=None):
    answers = answers or {s.id: f"answer of {s.id}" for s in workload.requests}
    return {s.id: tok.prompt_ids(s.render(answers)) for s in workload.requests}


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_same_seed_same_prompts_other_seed_other_prompts(chat_tok, name):
    a = build_workload(name, chat_tok, seed=3, quick=True)
    b = build_workload(name, chat_tok, seed=3, quick=True)
    c = build_workload(name, chat_tok, seed=4, quick=True)
    assert a.requests == b.requests and a.info == b.info
    assert [s.messages for s in a.requests] != [s.messages for s in c.requests]


def test_handbook_shape_and_shared_document(chat_tok):
    w = build_workload("handbook", chat_tok, seed=0,
                       overrides={"readers": "6", "doc_tokens": "500", "follow_up_every": "2"})
    kinds = [s.kind for s in w.requests]
    assert kinds.count("question") == 6 and kinds.count("follow_up") == 3
    assert kinds.count("analysis") == 3 and kinds.count("combine") == 1
    assert 500 <= w.info["doc_tokens"] < 700
    ids = _ids(chat_tok, w)
    doc_turn = chat_tok.prompt_ids([{"role": "system",
                                     "content": w.requests[0].messages[0].parts[0]}])
    doc_len = len(doc_turn) - 3  # minus the assistant header of add_generation_prompt
    assert doc_len > 500
    first = ids["reader0"]
    for spec in w.requests:  # every request starts with the document, token for token
        assert common_prefix(first, ids[spec.id]) >= doc_len
    # a follow-up extends its own conversation: its parent's prompt is its prefix
    parent = w.requests[0]
    follow = next(s for s in w.requests if s.kind == "follow_up" and parent.id in s.depends_on)
    assert ids[follow.id][:len(ids[parent.id])] == ids[parent.id]
    combine = w.requests[-1]
    assert combine.depends_on == ("analyst-0", "analyst-1", "analyst-2")
    assert all(f"answer of analyst-{k}" in combine.render(
        {f"analyst-{k}": f"answer of analyst-{k}" for k in range(3)})[-1]["content"]
        for k in range(3))


def test_questions_are_about_forty_tokens(chat_tok):
    w = build_workload("handbook", chat_tok, seed=1, quick=True)
    lengths = [chat_tok.count(s.messages[-1].parts[0]) for s in w.requests
               if s.kind == "question"]
    assert all(28 <= n <= 70 for n in lengths), lengths


def test_multi_doc_interleaves_documents_and_exceeds_one_cache(chat_tok):
    w = build_workload("multi-doc", chat_tok, seed=0)
    assert w.info["doc_tokens_total"] > 16384  # the default KV slots of a bench stack
    docs = [s.id.split("-")[0] for s in w.requests]
    assert len(set(docs[:12])) == 12  # one question per document per round
    w = build_workload("multi-doc", chat_tok, seed=0, quick=True)
    ids = _ids(chat_tok, w)
    same = [s.id for s in w.requests if s.id.startswith("doc0-")]
    other = [s.id for s in w.requests if s.id.startswith("doc1-")]
    assert common_prefix(ids[same[0]], ids[same[1]]) > 300
    assert common_prefix(ids[same[0]], ids[other[0]]) < 40


def test_multi_turn_grows_turn_by_turn(chat_tok):
    w = build_workload("multi-turn", chat_tok, seed=0, quick=True)
    assert [s.id for s in w.requests if s.id.startswith("s1-")] == ["s1-t0", "s1-t1", "s1-t2"]
    by_id = {s.id: s for s in w.requests}
    assert by_id["s1-t2"].depends_on == ("s1-t0", "s1-t1")
    ids = _ids(chat_tok, w)
    assert ids["s1-t2"][:len(ids["s1-t1"])] == ids["s1-t1"]


def test_random_shares_nothing_beyond_the_template_header(chat_tok):
    w = build_workload("random", chat_tok, seed=0, quick=True)
    ids = list(_ids(chat_tok, w).values())
    assert max(common_prefix(a, b) for i, a in enumerate(ids) for b in ids[i + 1:]) < 8
    assert w.info["root_ideal_hit_rate"] < 0.02
    assert all(100 <= len(x) <= 700 for x in ids)


def test_bad_parameters_are_refused(chat_tok):
    with pytest.raises(ValueError, match="no parameter"):
        build_workload("handbook", chat_tok, overrides={"bogus": "1"})
    with pytest.raises(ValueError, match="integer"):
        build_workload("handbook", chat_tok, overrides={"readers": "many"})
    with pytest.raises(ValueError, match="positive"):
        build_workload("handbook", chat_tok, overrides={"readers": "0"})
    with pytest.raises(ValueError, match="unknown workload"):
        build_workload("nope", chat_tok)


def test_workload_rejects_children_before_parents():
    child = RequestSpec("b", "turn", (Message("assistant", (Answer("a"),)),), 4)
    parent = RequestSpec("a", "turn", (Message.text("user", "hi"),), 4)
    with pytest.raises(ValueError, match="do not come before"):
        Workload("x", [child, parent])
    with pytest.raises(ValueError, match="duplicate"):
        Workload("x", [parent, parent])
    assert Workload("x", [parent, child]).roots == [parent]


def test_tiered_docs_cycle_and_zipf(chat_tok):
    cyclic = build_workload("tiered-docs", chat_tok, seed=0,
                            overrides={"docs": "4", "doc_tokens": "200", "requests": "12"})
    docs = [s.id.split("-")[0] for s in cyclic.requests]
    assert docs == ["doc0", "doc1", "doc2", "doc3"] * 3  # a cycle: the worst case for LRU
    assert 4 * 200 <= cyclic.info["doc_tokens_total"] < 4 * 400  # with the instructions
    assert cyclic.info["root_ideal_hit_rate"] > 0.5  # every document is asked three times
    zipf = build_workload("tiered-docs", chat_tok, seed=0, overrides={
        "docs": "8", "doc_tokens": "100", "requests": "200", "zipf_x100": "120"})
    counts = [sum(s.id.startswith(f"doc{d}-") for s in zipf.requests) for d in range(8)]
    assert counts[0] > 2 * counts[7] and sum(counts) == 200  # popular documents first


def test_zipf_variant_is_seeded_and_asks_the_cyclic_variants_documents(chat_tok):
    params = {"docs": "6", "doc_tokens": "120", "requests": "30"}
    cyclic = build_workload("tiered-docs", chat_tok, seed=5, overrides=params)
    zipf = build_workload("tiered-docs-zipf", chat_tok, seed=5, overrides=params)
    again = build_workload("tiered-docs-zipf", chat_tok, seed=5, overrides=params)
    other = build_workload("tiered-docs-zipf", chat_tok, seed=6, overrides=params)
    assert zipf.name == "tiered-docs-zipf" and zipf.params["zipf_x100"] == 110
    assert zipf.requests == again.requests  # deterministic for a seed
    docs = lambda w: [s.id.split("-")[0] for s in w.requests]  # noqa: E731
    assert docs(zipf) != docs(other)
    # NOTE: the same seed gives the same documents; only the order of access differs
    first = {s.id.split("-")[0]: s.messages[0] for s in cyclic.requests}
    assert all(s.messages[0] == first[s.id.split("-")[0]] for s in zipf.requests)
    assert docs(zipf) != docs(cyclic)
    assert zipf.info["docs_asked"] == len(set(docs(zipf))) <= 6
    assert cyclic.info["docs_asked"] == 6 and cyclic.info["asked_doc_tokens"] == cyclic.info["doc_tokens_total"]


def test_access_order_cycles_or_follows_zipf_popularity():
    rng = np.random.default_rng(0)
    assert access_order(3, 7, 0, rng).tolist() == [0, 1, 2, 0, 1, 2, 0]
    counts = np.bincount(access_order(10, 20_000, 110, np.random.default_rng(1)), minlength=10)
    expected = 1.0 / np.arange(1, 11) ** 1.1
    assert np.allclose(counts / counts.sum(), expected / expected.sum(), atol=0.01)
    assert (access_order(10, 50, 110, np.random.default_rng(2))
            == access_order(10, 50, 110, np.random.default_rng(2))).all()
