"""One field list: every SamplingParams field has a path from every request body, and every
body field is a sampling parameter or named as none (services/gateway/sampling.py)."""

from __future__ import annotations

import msgspec
import pytest

from libs.protocol.messages import SamplingParams
from services.gateway import sampling
from services.gateway.schemas import (
    ChatCompletionRequest, CompletionRequest, GenerateRequest, OpenAIRequestBase, SamplingParamsBody,
)

from .test_routes import CHAT, COMPLETION, backend, client  # noqa: F401 - fixtures

FIELDS = msgspec.structs.fields(SamplingParams)
COPIED = [f for f in FIELDS if f.name not in sampling.DERIVED]
OPENAI_COPIED = [f for f in COPIED if f.name not in sampling.OPENAI_LOGPROBS]
HTTP_NAME = {param: name for name, param in sampling.ALIASES.items()}


def _carried(field: str, *bodies: type[msgspec.Struct]) -> bool:
    return any(name in body.__struct_fields__ for body in bodies for name in (field, HTTP_NAME.get(field)))


@pytest.mark.parametrize("field", [f.name for f in FIELDS])
def test_every_sampling_field_has_a_path_from_each_api(field):
    derived = field in sampling.DERIVED
    assert derived or _carried(field, SamplingParamsBody, GenerateRequest), \
        f"SamplingParams.{field}: no /generate body field carries it (schemas.py), nor is it DERIVED (sampling.py)"
    assert derived or field in sampling.OPENAI_LOGPROBS or _carried(field, OpenAIRequestBase), \
        f"SamplingParams.{field}: no OpenAI body field carries it (schemas.py), nor is it DERIVED (sampling.py)"


@pytest.mark.parametrize("body", [ChatCompletionRequest, CompletionRequest, GenerateRequest, SamplingParamsBody])
def test_every_body_field_is_a_sampling_field_or_named_as_none(body):
    for name in body.__struct_fields__:
        param = sampling.ALIASES.get(name, name)
        assert param in sampling.PARAMS or name in sampling.REQUEST_FIELDS, (
            f"{body.__name__}.{name} reaches no SamplingParams field: name it as one (or in ALIASES), "
            "or as no sampling parameter in REQUEST_FIELDS (services/gateway/sampling.py)")


def test_the_lists_name_real_fields():
    assert set(sampling.DERIVED) <= sampling.PARAMS and sampling.OPENAI_LOGPROBS <= sampling.PARAMS
    assert set(sampling.ALIASES.values()) <= sampling.PARAMS and set(sampling.CONVERT) <= sampling.PARAMS
    assert not (sampling.REQUEST_FIELDS - {"max_new_tokens"}) & sampling.PARAMS  # none hidden


def _sample(field: msgspec.structs.FieldInfo):
    """A value other than the default, as HTTP sends it and as SamplingParams holds it."""
    by_type = {bool: (not field.default, not field.default), float: (0.5, 0.5), int: (3, 3), int | None: (3, 3),
               list[str]: (["x"], ["x"]), list[int]: ([7], [7]), dict[int, float]: ({"7": 1.5}, {7: 1.5})}
    assert field.type in by_type, f"SamplingParams.{field.name}: give this test a sample of {field.type}"
    return by_type[field.type]


@pytest.mark.parametrize("field", OPENAI_COPIED, ids=lambda f: f.name)
@pytest.mark.parametrize("path,base", [("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)])
async def test_each_openai_field_reaches_the_sampling_params(client, backend, path, base, field):
    sent, held = _sample(field)
    await client.post(path, json={**base, "max_tokens": 16, field.name: sent})
    [req] = backend.requests
    assert getattr(req.sampling(16), field.name) == held
    assert req.sampling(16) == msgspec.structs.replace(sampling.unresolved(**{field.name: held}), max_new_tokens=16)


@pytest.mark.parametrize("field", COPIED, ids=lambda f: f.name)
async def test_each_native_field_reaches_the_sampling_params(client, backend, field):
    sent, held = _sample(field)
    name = next(n for n in (HTTP_NAME.get(field.name), field.name) if _carried(n, SamplingParamsBody, GenerateRequest))
    body = {"text": "q", "sampling_params": {"max_new_tokens": 16}}
    if name in SamplingParamsBody.__struct_fields__:
        body["sampling_params"][name] = sent
    else:  # SGLang's logprob fields sit beside sampling_params
        body[name] = sent
    await client.post("/generate", json=body)
    [req] = backend.requests
    assert req.sampling(16) == msgspec.structs.replace(sampling.unresolved(**{field.name: held}), max_new_tokens=16)
