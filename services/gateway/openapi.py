"""The OpenAPI 3.1 document, with request schemas generated from the msgspec Structs."""

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


def _post(summary: str, schema_ref: dict) -> dict:
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": {"application/json": {"schema": schema_ref}}},
        "responses": {
            "200": {"description": "JSON, or text/event-stream when stream is true",
                    "content": {"application/json": {"schema": {"type": "object"}},
                                "text/event-stream": {"schema": {"type": "string"}}}},
            "default": {"description": "error",
                        "content": {"application/json": {"schema": {"$ref": _REF.format(name="Error")}}}},
        },
    }}


def _get(summary: str) -> dict:
    return {"get": {"summary": summary, "responses": {
        "200": {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}},
    }}}


def openapi_document(title: str = "radixmesh gateway", version: str = "0.1.0") -> dict:
    refs, components = msgspec.json.schema_components(REQUEST_TYPES, ref_template=_REF)
    chat, completion, generate = refs
    components["Error"] = _ERROR
    health = _get("healthy when a tokenizer and at least one worker are reachable")
    health["get"]["responses"]["503"] = {"description": "something is missing"}
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "paths": {
            "/v1/chat/completions": _post("OpenAI chat completions", chat),
            "/v1/completions": _post("OpenAI text completions", completion),
            "/generate": _post("SGLang native generate", generate),
            "/v1/models": _get("served models"),
            "/health": health,
            "/flush_cache": {"post": {
                "summary": "empty every worker's prefix cache (400 while requests run)",
                "responses": {"200": {"description": "slots freed per worker"},
                              "400": {"description": "a worker is serving requests"}},
            }},
        },
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
