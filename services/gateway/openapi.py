"""The OpenAPI 3.1 document, with request schemas generated from the msgspec Structs.

The request bodies are exactly what the gateway decodes (bounds, enums, no
unknown fields), so a fuzzer driven by this document (schemathesis, see
tests/integration/test_schemathesis.py) explores the real input space.
"""

from __future__ import annotations

import msgspec

from .schemas import REQUEST_TYPES

_REF = "#/components/schemas/{name}"
_ERROR = {
    "type": "object",
    "properties": {"error": {"type": "object", "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]},
    }, "required": ["message", "type", "param", "code"]}},
    "required": ["error"],
}
_RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before retrying",
                                "schema": {"type": "string"}}}
_GENERATION_ERRORS = {
    "400": "invalid request: a bad field (named in error.param), a prompt or max_tokens "
           "over this server's limits, a prompt longer than the context",
    "401": "missing or unknown API key",
    "404": "unknown model",
    "413": "request body too large",
    "429": "too many concurrent requests on this gateway",
    "503": "overloaded or no worker available",
    "408": "the request's own timeout passed (it was aborted)",
    "504": "this server's deadline passed, or no output for too long",
}


def _error(description: str, retry: bool = False) -> dict:
    response = {"description": description,
                "content": {"application/json": {"schema": {"$ref": _REF.format(name="Error")}}}}
    if retry:
        response["headers"] = _RETRY_AFTER
    return response


def _post(summary: str, schema_ref: dict) -> dict:
    responses = {"200": {"description": "JSON, or text/event-stream when stream is true",
                         "content": {"application/json": {"schema": {"type": "object"}},
                                     "text/event-stream": {"schema": {"type": "string"}}}}}
    for status, description in _GENERATION_ERRORS.items():
        responses[status] = _error(description, retry=status in ("429", "503"))
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": {"application/json": {"schema": schema_ref}}},
        "responses": responses,
    }}


def _get(summary: str) -> dict:
    return {"get": {"summary": summary, "responses": {
        "200": {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}},
        "401": _error("missing or unknown API key"),
    }}}


def openapi_document(title: str = "radixmesh gateway", version: str = "0.1.0",
                     models: tuple[str, ...] = (), secured: bool = False) -> dict:
    """The gateway's API; ``models`` (the accepted names) become an enum of ``model``,
    ``secured`` marks every operation but health, schema and metrics as bearer-only."""
    refs, components = msgspec.json.schema_components(REQUEST_TYPES, ref_template=_REF)
    chat, completion, generate = refs
    if models:
        for name in ("ChatCompletionRequest", "CompletionRequest"):
            components[name]["properties"]["model"] = {"type": "string", "enum": sorted(models)}
    components["Error"] = _ERROR
    health = {"get": {"summary": "healthy when a tokenizer and at least one worker are reachable",
                      "security": [], "responses": {
                          "200": {"description": "OK", "content": {
                              "application/json": {"schema": {"type": "object"}}}},
                          "503": {"description": "something is missing", "headers": _RETRY_AFTER,
                                  "content": {"application/json": {"schema": {"type": "object"}}}},
                      }}}
    model = _get("one served model")
    model["get"]["parameters"] = [{"name": "model", "in": "path", "required": True,
                                   "schema": {"type": "string"}}]
    model["get"]["responses"]["404"] = _error("unknown model")
    doc = {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "paths": {
            "/v1/chat/completions": _post("OpenAI chat completions", chat),
            "/v1/completions": _post("OpenAI text completions", completion),
            "/generate": _post("SGLang native generate", generate),
            "/v1/models": _get("served models"),
            "/v1/models/{model}": model,
            "/health": health,
            "/flush_cache": {"post": {
                "summary": "empty every worker's prefix cache (400 while requests run)",
                "responses": {"200": {"description": "slots freed per worker"},
                              "400": _error("a worker is serving requests"),
                              "401": _error("missing or unknown API key"),
                              "404": _error("cache flushing is not enabled")},
            }},
        },
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
    if secured:
        doc["security"] = [{"bearer": []}]
    return doc
