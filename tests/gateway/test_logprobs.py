"""Logprob response shapes (services/gateway/logprobs.py), echo/batch formatting and conversion."""

from __future__ import annotations

import math

import msgspec

from libs.protocol.messages import Logprobs, Usage
from services.gateway import convert
from services.gateway.formats import OpenAIFormat, native_body
from services.gateway.generation import Completion
from services.gateway.logprobs import chat_logprobs, legacy_logprobs, merge_logprobs, native_logprobs
from services.gateway.schemas import CompletionRequest

NAN = float("nan")


def _lp(start=0) -> Logprobs:
    return Logprobs(start=start, token_ids=[5, 6, 7], logprobs=[NAN, -1.0, -2.0],
                    top_ids=[[], [6, 9], [8, 7]], top_logprobs=[[], [-1.0, -3.0], [-0.5, -2.0]],
                    tokens=["Hi", " there", "!"], top_tokens=[[], [" there", " you"], [".", "!"]])


def test_merge_concatenates_pieces_in_order():
    a, b = _lp(), Logprobs(start=3, token_ids=[1], logprobs=[-0.1], top_ids=[[1]],
                           top_logprobs=[[-0.1]], tokens=["x"], top_tokens=[["x"]])
    m = merge_logprobs([None, a, None, b])
    assert m.start == 0 and m.token_ids == [5, 6, 7, 1] and m.tokens[-1] == "x"
    assert merge_logprobs([None]) is None and merge_logprobs([a]) is a


def test_legacy_chat_and_native_shapes():
    legacy = legacy_logprobs(_lp())
    assert legacy == {"tokens": ["Hi", " there", "!"], "token_logprobs": [None, -1.0, -2.0],
                      "top_logprobs": [None, {" there": -1.0, " you": -3.0}, {".": -0.5, "!": -2.0}],
                      "text_offset": [0, 2, 8]}
    assert legacy_logprobs(_lp(), skip=2, with_top=False)["tokens"] == ["!"]
    chat = chat_logprobs(Logprobs(start=4, token_ids=[7], logprobs=[-2.0], top_ids=[[8]],
                                  top_logprobs=[[-0.5]], tokens=["é"], top_tokens=[["."]]))
    assert chat["content"] == [{"token": "é", "logprob": -2.0, "bytes": [195, 169],
                                "top_logprobs": [{"token": ".", "logprob": -0.5, "bytes": [46]}]}]
    native = native_logprobs(_lp(), prompt_tokens=2)
    assert native["input_token_logprobs"] == [[None, 5, "Hi"], [-1.0, 6, " there"]]
    assert native["output_token_logprobs"] == [[-2.0, 7, "!"]]
    assert native["output_top_logprobs"] == [[[-0.5, 8, "."], [-2.0, 7, "!"]]]
    body = native_body("r", "!", [7], "length", Usage(prompt_tokens=2, completion_tokens=1), _lp())
    assert body["meta_info"]["input_token_logprobs"][0][0] is None


def _body(**kw) -> CompletionRequest:
    return msgspec.convert({"model": "m", **kw}, CompletionRequest)


def test_completion_requests_batch_echo_and_prefill_only():
    reqs = convert.completion_requests(_body(prompt=["a b", "c"], max_tokens=0, echo=True, logprobs=1))
    assert [r.text for r in reqs] == ["a b", "c"]
    assert all(r.max_new_tokens == 0 and r.params.return_logprob and r.params.logprob_start_len == 0
               and r.params.top_logprobs_num == 1 and r.show_logprobs and r.echo for r in reqs)
    sp = reqs[0].sampling(0)
    assert (sp.max_new_tokens, sp.return_logprob, sp.logprob_start_len, sp.top_logprobs_num) == (0, True, 0, 1)
    ids = convert.completion_requests(_body(prompt=[4, 5], echo=True))[0]
    assert ids.params.return_logprob and not ids.show_logprobs  # the echo of token ids needs their text
    plain = convert.completion_requests(_body(prompt="x", logprobs=0))[0]
    assert plain.params.logprob_start_len == -1 and plain.params.top_logprobs_num == 0


def _done(rid, text, ids, usage, lp) -> Completion:
    done = Completion(rid, text, ids, "length", usage)
    done.logprobs = lp  # NOTE: what Generation.collect fills in
    return done


def test_batch_response_echoes_prompts_and_sums_usage():
    reqs = convert.completion_requests(_body(prompt=["Hi there", "Hi"], max_tokens=1, echo=True,
                                             logprobs=0))
    lp = _lp()
    dones = [_done("r0", "!", [7], Usage(2, 1, 0), lp), _done("r1", "", [], Usage(1, 0, 1), None)]
    body = OpenAIFormat("r", "m", chat=False).batch_response(dones, reqs)
    first, second = body["choices"]
    assert first["text"] == "Hi there!" and first["logprobs"]["top_logprobs"] is None
    assert first["logprobs"]["token_logprobs"] == [None, -1.0, -2.0]
    assert second == {"index": 1, "text": "Hi", "logprobs": None, "finish_reason": "length"}
    assert body["usage"]["prompt_tokens"] == 3 and body["usage"]["prompt_tokens_details"]["cached_tokens"] == 1
    plain = convert.completion_requests(_body(prompt="Hi there", max_tokens=1, logprobs=2))[0]
    done = _done("r", "!", [7], Usage(2, 1, 0), _lp())
    choice = OpenAIFormat("r", "m", chat=False).response(done, plain)["choices"][0]
    assert choice["text"] == "!" and choice["logprobs"]["tokens"] == ["!"]  # the completion's only
    assert not math.isnan(choice["logprobs"]["token_logprobs"][0])
