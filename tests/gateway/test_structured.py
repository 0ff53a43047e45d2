"""response_format and regex become the one pattern a request's output must match."""

from __future__ import annotations

import json
import re

import pytest

from libs.grammar.json_schema import JSON_OBJECT_REGEX, schema_to_regex

from .test_routes import CHAT, COMPLETION, RecordingBackend, _error, make_client

@pytest.fixture()
def backend() -> RecordingBackend:
    return RecordingBackend()


@pytest.fixture()
async def client(backend):
    async with make_client(backend) as client:
        yield client


PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"]}


def _format(schema=PERSON) -> dict:
    return {"response_format": {"type": "json_schema",
                                "json_schema": {"name": "person", "schema": schema, "strict": True}}}


async def test_a_json_schema_becomes_the_requests_regex(client, backend):
    await client.post("/v1/chat/completions", json={**CHAT, **_format()})
    await client.post("/v1/completions", json={**COMPLETION, "response_format": {"type": "json_object"}})
    await client.post("/v1/chat/completions", json={**CHAT, "response_format": {"type": "text"}})
    schema, json_object, text = backend.requests
    assert schema.params.regex == schema_to_regex(PERSON)
    assert re.fullmatch(schema.params.regex, json.dumps({"name": "Ada", "age": 36}, separators=(",", ":")))
    assert not re.fullmatch(schema.params.regex, json.dumps({"name": "Ada"}, separators=(",", ":")))
    assert json_object.params.regex == JSON_OBJECT_REGEX and text.params.regex == ""


@pytest.mark.parametrize("patch, param, contains", [
    ({"response_format": {"type": "xml"}}, "response_format.type", "xml"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema", "schema"),
    (_format({"type": "object", "properties": {"n": {"type": "number", "multipleOf": 3}}}),
     "response_format.json_schema.schema", "json_schema"),
    ({**_format(), "regex": "a+"}, "response_format", "either"),
    (_format({"type": "object", "required": ["a"],
              "properties": {"a": {"type": "string", "maxLength": 2000}}}),
     "response_format.json_schema.schema", "too large"),
    (_format({"type": "string", "maxLength": 10**30}), "response_format.json_schema.schema",
     "at most"),
    ({**_format(), "ignore_eos": True}, "response_format", "ignore_eos"),
    ({"response_format": {"type": "json_object", "extra": 1}}, "response_format.extra", "Unrecognized"),
])
async def test_unusable_formats_are_400(client, backend, patch, param, contains):
    _error(await client.post("/v1/chat/completions", json={**CHAT, **patch}), 400, param, contains)
    assert backend.requests == []


async def test_generate_takes_sglangs_json_schema_as_object_or_string(client, backend):
    await client.post("/generate", json={"text": "q", "sampling_params": {"json_schema": PERSON}})
    await client.post("/generate", json={"text": "q", "sampling_params": {"json_schema": json.dumps(PERSON)}})
    as_object, as_string = backend.requests
    assert as_object.params.regex == as_string.params.regex == schema_to_regex(PERSON)


@pytest.mark.parametrize("sampling, contains", [
    ({"json_schema": "{not json"}, "not valid JSON"),
    ({"json_schema": "[1, 2]"}, "schema object"),
    ({"json_schema": {"type": "string", "uniqueItems": True, "not": {}}}, "json_schema"),
    ({"json_schema": PERSON, "regex": "a+"}, "either"),
    ({"json_schema": PERSON, "ignore_eos": True}, "ignore_eos"),
])
async def test_bad_native_json_schemas_are_400(client, backend, sampling, contains):
    resp = await client.post("/generate", json={"text": "q", "sampling_params": sampling})
    _error(resp, 400, "sampling_params.json_schema", contains)
    assert backend.requests == []
