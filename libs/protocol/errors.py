"""Typed errors that cross the bus and map onto HTTP statuses."""

from __future__ import annotations

from .messages import ErrorInfo


class ServiceError(Exception):
    """An error with a machine-readable code; raised by handlers, re-raised by requesters."""

    def __init__(self, code: str, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status

    def info(self) -> ErrorInfo:
        return ErrorInfo(code=self.code, message=self.message, status=self.status)

    @classmethod
    def from_info(cls, info: ErrorInfo) -> "ServiceError":
        return cls(info.code, info.message, info.status)

    def __repr__(self) -> str:
        return f"ServiceError({self.code!r}, {self.message!r}, {self.status})"


def invalid_request(message: str) -> ServiceError:
    return ServiceError("invalid_request_error", message, 400)


def context_length_exceeded(message: str) -> ServiceError:
    return ServiceError("context_length_exceeded", message, 400)


def overloaded(message: str) -> ServiceError:
    return ServiceError("overloaded", message, 503)


def unavailable(message: str) -> ServiceError:
    return ServiceError("service_unavailable", message, 503)


def timeout(message: str) -> ServiceError:
    return ServiceError("timeout", message, 504)


def internal(message: str) -> ServiceError:
    return ServiceError("internal_error", message, 500)


def stream_gap(message: str) -> ServiceError:
    """A token batch of a stream was lost on the way (a broker node died, a reconnect):
    the request resumes from the last token its client got."""
    return ServiceError("stream_gap", message, 503)
