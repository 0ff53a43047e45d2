"""The generation endpoints: /v1/chat/completions, /v1/completions, /generate."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, Callable, Protocol, TypeVar

import msgspec
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from libs.protocol import ServiceError

from . import convert
from .errors import ApiError, bad_request, from_validation
from .formats import OpenAIFormat, delta_usage, native_body
from .generation import Completion, Generation
from .pipeline import GenerationRequest
from .schemas import ChatCompletionRequest, CompletionRequest, GenerateRequest
from .sse import SSE_DONE, ClientGone, SSEResponse, run_until_disconnect, sse_event

T = TypeVar("T")
log = logging.getLogger("radixmesh.gateway")
_json = msgspec.json.Encoder()


class Submitter(Protocol):
    """What the routes need from the pipeline (see :class:`Pipeline`)."""

    async def submit(self, req: GenerationRequest) -> Generation: ...


@dataclass(frozen=True)
class GatewaySettings:
    served_model_name: str
    model_aliases: tuple[str, ...] = ()  # other names accepted in requests
    api_key: str | None = None
    max_body_bytes: int = 8 * 1024 * 1024

    @property
    def accepted_models(self) -> frozenset[str]:
        return frozenset((self.served_model_name, *self.model_aliases))


def json_response(body: dict, status: int = 200) -> Response:
    return Response(_json.encode(body), status, media_type="application/json")


def endpoint(fn: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """Map every failure of a route onto an OpenAI-style error response."""

    @functools.wraps(fn)
    async def wrapped(request: Request) -> Response:
        try:
            return await fn(request)
        except ApiError as exc:
            return exc.response()
        except ServiceError as exc:
            return ApiError.from_service(exc).response()
        except (ClientGone, ClientDisconnect):
            return Response(status_code=499)  # nobody reads it
        except Exception:  # noqa: BLE001 - never a bare 500 page
            log.exception("%s failed", request.url.path)
            return ApiError(500, "internal error in the gateway", code="internal_error").response()

    return wrapped


async def read_body(request: Request, kind: type[T], limit: int) -> T:
    """Read at most ``limit`` bytes and decode them as ``kind`` (400/413 on failure)."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise ApiError(413, f"request body larger than {limit} bytes", code="request_too_large")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"request body larger than {limit} bytes", code="request_too_large")
        chunks.append(chunk)
    try:
        return msgspec.json.decode(b"".join(chunks), type=kind)
    except msgspec.ValidationError as exc:
        raise from_validation(exc) from None
    except msgspec.DecodeError as exc:
        raise bad_request(f"request body is not valid JSON: {exc}") from None


class GenerationRoutes:
    """Endpoint handlers bound to one pipeline and the gateway's settings."""

    def __init__(self, pipeline: Submitter, settings: GatewaySettings) -> None:
        self.pipeline = pipeline
        self.settings = settings

    async def chat_completions(self, request: Request) -> Response:
        body = await read_body(request, ChatCompletionRequest, self.settings.max_body_bytes)
        convert.check_model(body.model, self.settings.accepted_models)
        return await self._openai(request, body, convert.chat_request(body), chat=True)

    async def completions(self, request: Request) -> Response:
        body = await read_body(request, CompletionRequest, self.settings.max_body_bytes)
        convert.check_model(body.model, self.settings.accepted_models)
        return await self._openai(request, body, convert.completion_request(body), chat=False)

    async def generate(self, request: Request) -> Response:
        body = await read_body(request, GenerateRequest, self.settings.max_body_bytes)
        req = convert.generate_request(body)
        if body.stream:
            gen = await run_until_disconnect(request.receive, self.pipeline.submit(req))
            return SSEResponse(native_events(gen), on_close=gen.close)
        done = await run_until_disconnect(request.receive, self._complete(req))
        return json_response(native_body(done.rid, done.text, done.token_ids,
                                         done.finish_reason, done.usage))

    async def _openai(self, request: Request, body, req: GenerationRequest, chat: bool) -> Response:
        model = self.settings.served_model_name
        if body.stream:
            gen = await run_until_disconnect(request.receive, self.pipeline.submit(req))
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            fmt = OpenAIFormat(gen.rid, model, chat, include_usage)
            return SSEResponse(openai_events(gen, fmt), on_close=gen.close)
        done = await run_until_disconnect(request.receive, self._complete(req))
        return json_response(OpenAIFormat(done.rid, model, chat).response(done))

    async def _complete(self, req: GenerationRequest) -> Completion:
        gen = await self.pipeline.submit(req)
        async with gen:
            return await gen.collect()


async def openai_events(gen: Generation, fmt: OpenAIFormat) -> AsyncIterator[bytes]:
    """SSE chunks of an OpenAI stream; a failure becomes an error event."""
    async with gen:
        if fmt.chat:
            yield sse_event(fmt.chunk("", role=True))
        try:
            async for delta in gen:
                if delta.text:
                    yield sse_event(fmt.chunk(delta.text))
                if delta.finish_reason is not None:
                    yield sse_event(fmt.chunk(None, delta.finish_reason))
        except ServiceError as exc:
            yield sse_event(ApiError.from_service(exc).body())
        else:
            if fmt.include_usage:
                yield sse_event(fmt.usage_chunk(gen.final_usage()))
        yield SSE_DONE


async def native_events(gen: Generation) -> AsyncIterator[bytes]:
    """SGLang-style stream: each event is the cumulative /generate object."""
    async with gen:
        text = ""
        ids: list[int] = []
        try:
            async for delta in gen:
                text += delta.text
                ids.extend(delta.token_ids)
                usage = delta_usage(delta, gen.prompt_tokens, len(ids))
                yield sse_event(native_body(gen.rid, text, ids, delta.finish_reason, usage))
        except ServiceError as exc:
            yield sse_event(ApiError.from_service(exc).body())
        yield SSE_DONE
