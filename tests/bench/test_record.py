from radixmesh.bench.record import Record, check


def good(**kw) -> Record:
    base = dict(ttft_s=0.1, e2e_s=0.5, itl_s=[0.1, 0.0, 0.3], completion_tokens=4,
                stream_tokens=4, prompt_tokens=20, client_prompt_tokens=20, cached_tokens=8)
    base.update(kw)
    return Record("sys", "r1", "question", **base)


def test_consistent_record_passes():
    assert check([good(), good(error="HTTP 400: bad", ttft_s=None)]) == []


def test_each_inconsistency_is_named():
    assert "ttft" in check([good(ttft_s=0.9)])[0]
    assert "streamed" in check([good(stream_tokens=3)])[0]
    assert "gaps" in check([good(itl_s=[0.1])])[0]
    assert "usage says 21" in check([good(prompt_tokens=21, cached_tokens=0)])[0]
    assert "cached" in check([good(cached_tokens=30)])[0]
    assert "without output" in " ".join(check([good(completion_tokens=0, stream_tokens=0,
                                                    itl_s=[])]))


def test_chunk_gaps_are_not_held_to_token_counts():
    assert check([good(per_token_gaps=False, itl_s=[0.2], stream_tokens=None)]) == []


def test_server_ttft_must_agree_within_ten_ms_median():
    close = [good(ttft_s=0.100, server_ttft_s=0.095), good(ttft_s=0.2, server_ttft_s=0.193)]
    assert check(close) == []
    far = [good(ttft_s=0.100, server_ttft_s=0.080), good(ttft_s=0.2, server_ttft_s=0.17)]
    assert "median" in check(far)[0]
