"""OpenAI-style error bodies: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import re

import msgspec
from starlette.responses import Response

from libs.protocol import ServiceError
from libs.protocol.messages import ErrorInfo


RETRY_STATUSES = frozenset({429, 503})


class ApiError(Exception):
    """An HTTP error the gateway answers with; raised anywhere in a route."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = error_type(status)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type,
                          "param": self.param, "code": self.code}}

    def response(self, retry_after: int = 1) -> Response:
        """The JSON response; 401 names the scheme, 429/503 say when to come back."""
        headers = None
        if self.status == 401:
            headers = {"WWW-Authenticate": "Bearer"}
        elif self.status in RETRY_STATUSES:
            headers = {"Retry-After": str(retry_after)}
        return Response(msgspec.json.encode(self.body()), self.status, headers,
                        media_type="application/json")

    @classmethod
    def from_service(cls, exc: ServiceError) -> "ApiError":
        return cls(exc.status, exc.message, code=exc.code)

    @classmethod
    def from_info(cls, info: ErrorInfo) -> "ApiError":
        return cls(info.status, info.message, code=info.code)


def error_type(status: int) -> str:
    """OpenAI's error types: every client error is an ``invalid_request_error``."""
    return "invalid_request_error" if status < 500 else "server_error"


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param)


def not_supported(param: str, what: str = "") -> ApiError:
    return bad_request(f"{param}{what} is not supported", param)


_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<name>[^`]+)`(?: - at `(?P<path>[^`]+)`)?")
_MISSING = re.compile(r"^Object missing required field `(?P<name>[^`]+)`(?: - at `(?P<path>[^`]+)`)?")
_AT = re.compile(r" - at `\$(?P<path>[^`]*)`$")


def from_validation(exc: msgspec.ValidationError) -> ApiError:
    """Turn a msgspec decode error into a 400 that names the offending field."""
    text = str(exc)
    unknown = _UNKNOWN.match(text)
    if unknown:
        param = _field(unknown)
        return bad_request(f"Unrecognized request argument supplied: {param}", param)
    missing = _MISSING.match(text)
    if missing:
        param = _field(missing)
        return bad_request(f"Missing required parameter: '{param}'", param)
    at = _AT.search(text)
    param = _param(at.group("path")) if at else None
    message = text[: at.start()] if at else text
    if param:
        message = f"Invalid value for '{param}': {message}"
    return bad_request(message, param)


def _field(match: re.Match) -> str:
    path = _param((match.group("path") or "$")[1:])
    name = match.group("name")
    return f"{path}.{name}" if path else name


def _param(path: str) -> str | None:
    """``.messages[0].role`` -> ``messages[0].role``; empty -> None."""
    path = path.lstrip(".")
    return path or None
