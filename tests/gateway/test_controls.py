"""Sampling controls (penalties, min_p, min_tokens, logit_bias) through the HTTP API."""

from __future__ import annotations

import pytest

from services.gateway.controls import check_token_ids
from services.gateway.sampling import unresolved
from libs.protocol import ServiceError

from .test_routes import CHAT, COMPLETION, _error, backend, client  # noqa: F401 - fixtures

BAD = [
    ({"presence_penalty": 2.5}, "presence_penalty", "<= 2.0"),
    ({"frequency_penalty": -2.01}, "frequency_penalty", ">= -2.0"),
    ({"frequency_penalty": "x"}, "frequency_penalty", "float"),
    ({"repetition_penalty": 0}, "repetition_penalty", "> 0.0"),
    ({"repetition_penalty": 3}, "repetition_penalty", "<= 2.0"),
    ({"min_p": 1.5}, "min_p", "<= 1.0"),
    ({"min_p": -0.1}, "min_p", ">= 0.0"),
    ({"min_tokens": -1}, "min_tokens", ">= 0"),
    ({"min_tokens": 9, "max_tokens": 8}, "min_tokens", "must not exceed"),
    ({"min_tokens": 2, "regex": "a+"}, "min_tokens", "exclude each other"),
    ({"logit_bias": {"12": 101}}, "logit_bias", "<= 100.0"),
    ({"logit_bias": {"12": -100.5}}, "logit_bias", ">= -100.0"),
    ({"logit_bias": {"cat": 1}}, "logit_bias", "token ids"),
    ({"logit_bias": {"-3": 1}}, "logit_bias", "token ids"),
    ({"logit_bias": {str(i): 1 for i in range(1025)}}, "logit_bias", "length <= 1024"),
    ({"logit_bias": [1, 2]}, "logit_bias", "object"),
]


def _param_matches(err: dict, param: str) -> None:
    assert err["param"] is not None and err["param"].startswith(param), err


@pytest.mark.parametrize("patch,param,contains", BAD)
@pytest.mark.parametrize("path,base", [("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)])
async def test_bad_controls_are_400_naming_the_field(client, backend, path, base, patch, param, contains):
    err = _error(await client.post(path, json={**base, **patch}), 400, contains=contains)
    _param_matches(err, param)
    assert backend.requests == []


BAD_NATIVE = [
    ({"presence_penalty": 3}, "sampling_params.presence_penalty", "<= 2.0"),
    ({"repetition_penalty": -1}, "sampling_params.repetition_penalty", "> 0.0"),
    ({"min_p": 2}, "sampling_params.min_p", "<= 1.0"),
    ({"min_new_tokens": 200, "max_new_tokens": 10}, "sampling_params.min_new_tokens", "must not exceed"),
    ({"logit_bias": {"x": 1}}, "sampling_params.logit_bias", "token ids"),
]


@pytest.mark.parametrize("patch,param,contains", BAD_NATIVE)
async def test_bad_native_controls_are_400(client, backend, patch, param, contains):
    err = _error(await client.post("/generate", json={"text": "a", "sampling_params": patch}), 400,
                 contains=contains)
    _param_matches(err, param)
    assert backend.requests == []


async def test_controls_reach_the_sampling_params(client, backend):
    controls = {"presence_penalty": 0.5, "frequency_penalty": -0.25, "repetition_penalty": 1.2,
                "min_p": 0.05, "logit_bias": {"7": 3, "11": -100}}
    await client.post("/v1/chat/completions", json={**CHAT, **controls, "min_tokens": 4})
    await client.post("/v1/completions", json={**COMPLETION, **controls, "min_tokens": 4})
    await client.post("/generate", json={"text": "q", "sampling_params": {**controls, "min_new_tokens": 4}})
    await client.post("/v1/completions", json=COMPLETION)
    *with_controls, plain = backend.requests
    for req in with_controls:
        s = req.sampling(16)
        assert (s.presence_penalty, s.frequency_penalty, s.repetition_penalty, s.min_p, s.min_tokens) == (
            0.5, -0.25, 1.2, 0.05, 4)
        assert s.logit_bias == {7: 3.0, 11: -100.0}
    s = plain.sampling(16)  # nothing asked: the defaults, all off
    assert (s.presence_penalty, s.frequency_penalty, s.repetition_penalty, s.min_p, s.min_tokens,
            s.logit_bias) == (0.0, 0.0, 1.0, 0.0, 0, {})


def test_logit_bias_ids_past_the_vocabulary_are_refused():
    from services.gateway.request import GenerationRequest

    req = GenerationRequest(text="a", params=unresolved(logit_bias={5: 1.0, 49152: 2.0}))
    with pytest.raises(ServiceError, match=r"logit_bias: token id 49152 out of range \[0, 49152\)") as exc:
        check_token_ids(req, 49152)
    assert exc.value.status == 400
    check_token_ids(req, 0)  # vocabulary not named: the worker checks
    check_token_ids(GenerationRequest(text="a", params=unresolved(logit_bias={49151: 1.0})), 49152)
