"""Structured output: a request's ``regex`` or ``response_format`` as the one
regex its output must fully match ("" = free). JSON schemas become regexes here
(libs/grammar/json_schema.py); the scheduler checks every pattern."""

from __future__ import annotations

import json

from libs.grammar.json_schema import JSON_OBJECT_REGEX, SchemaError, schema_to_regex

from .errors import bad_request
from .schemas import JsonSchemaFormat, ResponseFormat


def native_format(json_schema: str | dict | None) -> ResponseFormat | None:
    """SGLang's ``sampling_params.json_schema`` (an object, or one as a JSON string)."""
    if json_schema is None:
        return None
    if isinstance(json_schema, str):
        try:
            json_schema = json.loads(json_schema)
        except (ValueError, RecursionError):
            raise bad_request("sampling_params.json_schema is not valid JSON",
                              "sampling_params.json_schema") from None
    if not isinstance(json_schema, (dict, bool)):
        raise bad_request("sampling_params.json_schema must be a JSON schema object",
                          "sampling_params.json_schema")
    return ResponseFormat(type="json_schema", json_schema=JsonSchemaFormat(schema=json_schema))


def output_regex(regex: str | None, response_format: ResponseFormat | None = None,
                 ignore_eos: bool = False, where: str = "") -> str:
    """The pattern the output must match; 400 for a contradictory or unusable ask."""
    fmt = _format_regex(response_format, where)
    fmt_param = where + "json_schema" if where else "response_format"
    if regex and fmt:
        raise bad_request("give either regex or a JSON schema, not both", fmt_param)
    pattern = regex or fmt
    if pattern and ignore_eos:
        raise bad_request("regex and ignore_eos exclude each other: a constrained output "
                          "ends when it matches", where + "regex" if regex else fmt_param)
    return pattern


def _format_regex(fmt: ResponseFormat | None, where: str = "") -> str:
    if fmt is None or fmt.type == "text":
        return ""
    if fmt.type == "json_object":
        return JSON_OBJECT_REGEX
    spec = fmt.json_schema
    if spec is None or spec.schema is None:
        raise bad_request("response_format of type json_schema needs json_schema.schema",
                          "response_format.json_schema")
    param = where + "json_schema" if where else "response_format.json_schema.schema"
    try:
        pattern = schema_to_regex(spec.schema)
    except SchemaError as exc:
        raise bad_request(f"json_schema: {exc}", param) from None
    except RecursionError:
        raise bad_request("json_schema: nested too deeply", param) from None
    check_size(pattern, param)
    return pattern


def check_size(pattern: str, param: str) -> None:
    """The scheduler checks every pattern; a schema's is checked here too, so that a
    schema too large for the automaton gets an answer about the schema."""
    from libs.grammar.regex_dfa import parse_regex  # NOTE: numpy, only for JSON schemas
    from libs.grammar.regex_parse import RegexError

    try:
        parse_regex(pattern)
    except RegexError as exc:
        raise bad_request(f"json_schema: too large to constrain generation ({exc}); "
                          "bound fewer or shorter fields", param) from None
