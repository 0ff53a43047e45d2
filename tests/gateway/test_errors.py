"""msgspec validation errors become OpenAI-style 400s that name the field."""

from __future__ import annotations

import msgspec
import pytest

from libs.protocol import errors
from services.gateway.errors import ApiError, from_validation
from services.gateway.schemas import ChatCompletionRequest, GenerateRequest


def _error(raw: bytes, kind) -> ApiError:
    with pytest.raises(msgspec.ValidationError) as exc:
        msgspec.json.decode(raw, type=kind)
    return from_validation(exc.value)


def test_unknown_missing_and_mistyped_fields():
    err = _error(b'{"model":"m","messages":[{"role":"user","content":"x"}],"best_of":2}', ChatCompletionRequest)
    assert (err.status, err.param, err.message) == (400, "best_of", "Unrecognized request argument supplied: best_of")
    err = _error(b'{"model":"m","messages":[{"content":"x"}]}', ChatCompletionRequest)
    assert err.param == "messages[0].role" and "Missing required parameter" in err.message
    err = _error(b'{"text":"a","sampling_params":{"seed":"x"}}', GenerateRequest)
    assert err.param == "sampling_params.seed" and "Expected `int | null`, got `str`" in err.message
    err = _error(b'[1]', GenerateRequest)
    assert err.param is None and err.status == 400


def test_bodies_follow_openai_shape():
    body = ApiError.from_service(errors.overloaded("full")).body()
    assert body == {"error": {"message": "full", "type": "server_error", "param": None, "code": "overloaded"}}
    assert ApiError(401, "no key").response().headers["www-authenticate"] == "Bearer"
    assert ApiError(404, "x").type == "invalid_request_error"
