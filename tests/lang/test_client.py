from radixmesh.lang import choice_logprobs, pick
from radixmesh.lang.client import Usage


def test_choice_tokens_are_those_past_the_prefix():
    lp = {"tokens": ["The", " cat", " sat"], "text_offset": [0, 3, 7],
          "token_logprobs": [None, -1.0, -2.0]}
    assert choice_logprobs(lp, len(" sat")) == [-2.0]
    assert choice_logprobs(lp, len("t sat")) == [-1.0, -2.0]  # " cat" straddles: it counts
    assert choice_logprobs({"tokens": [], "text_offset": [], "token_logprobs": []}, 3) == []


def test_pick_sum_or_mean_and_first_on_ties():
    scores = [[-1.0, -1.0], [-1.5], [-0.9, -0.9, -0.9]]
    assert pick(scores) == 1
    assert pick(scores, normalize=True) == 2
    assert pick([[-1.0], [-1.0]]) == 0
    assert pick([[], [-50.0]]) == 1


def test_usage_from_body():
    u = Usage.from_body({"prompt_tokens": 10, "completion_tokens": 2,
                         "prompt_tokens_details": {"cached_tokens": 7}})
    assert (u.computed_tokens, u.cached_tokens) == (3, 7)
    assert Usage.from_body({"prompt_tokens": 1, "completion_tokens": 0}).cached_tokens == 0
