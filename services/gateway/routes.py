"""The generation endpoints: /v1/chat/completions, /v1/completions, /generate."""

from __future__ import annotations

import functools
import logging
import uuid
from dataclasses import dataclass, field
from typing import AsyncIterator, Awaitable, Callable, Protocol, TypeVar

import msgspec
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from libs.protocol import ServiceError, tracing

from . import convert
from .auth import Keyring, request_tenant, tenant_salt
from .errors import ApiError, bad_request, from_validation, not_supported
from .formats import OpenAIFormat, delta_usage, native_body
from .chat_stream import ChoiceStream
from .choices import choice_requests, close_all, collect_all, merged_events, open_choices
from .generation import Completion, Generation
from .limits import NO_DEADLINE, Deadline, Limits
from .logprobs import LogprobStream, stream_logprobs
from .pipeline import GenerationRequest
from .schemas import ChatCompletionRequest, CompletionRequest, GenerateRequest, SamplingParamsBody
from .sse import SSE_DONE, ClientGone, SSEResponse, run_until_disconnect, sse_event

T = TypeVar("T")
log = logging.getLogger("radixmesh.gateway")
_json = msgspec.json.Encoder()


class Submitter(Protocol):
    """What the routes need from the pipeline (see :class:`Pipeline`)."""

    async def submit(self, req: GenerationRequest) -> Generation: ...

    def abort(self, rid: str) -> bool: ...


@dataclass(frozen=True)
class GatewaySettings:
    served_model_name: str
    model_aliases: tuple[str, ...] = ()  # other names accepted in requests
    api_key: str | None = None  # one key of tenant "default" (see keyring)
    max_body_bytes: int = 8 * 1024 * 1024
    keyring: Keyring | None = None  # API keys -> tenants; none and no api_key: auth off
    limits: Limits = field(default_factory=Limits)

    @property
    def accepted_models(self) -> frozenset[str]:
        return frozenset((self.served_model_name, *self.model_aliases))


# NOTE: the worker that served a generation (for streams: the first one; /generate's
# last event and non-stream bodies also say it in meta_info.worker, after any move)
WORKER_HEADER = "x-radixmesh-worker"


def json_response(body: dict, status: int = 200, worker: str = "") -> Response:
    headers = {WORKER_HEADER: worker} if worker else None
    return Response(_json.encode(body), status, headers=headers, media_type="application/json")


def sse_response(gen: Generation, events: AsyncIterator[bytes],
                 plain: OpenAIFormat | None = None) -> SSEResponse:
    """``plain``: the stream's events are ``plain.text_event`` of each delta's text (no tool
    calls, no logprobs): such deltas may go straight to the connection (Generation.offer)."""
    on_stream = None
    if plain is not None:
        def on_stream(write: Callable[[bytes], bool]) -> None:
            gen.direct = lambda text: write(plain.text_event(text))
    return SSEResponse(events, on_close=gen.close, headers={WORKER_HEADER: gen.worker_id},
                       on_stream=on_stream)


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
    except RecursionError:
        raise bad_request("request body is nested too deeply") from None


class GenerationRoutes:
    """Endpoint handlers bound to one pipeline and the gateway's settings."""

    def __init__(self, pipeline: Submitter, settings: GatewaySettings) -> None:
        self.pipeline = pipeline
        self.settings = settings
        self.limits = settings.limits

    async def chat_completions(self, request: Request) -> Response:
        body = await read_body(request, ChatCompletionRequest, self.settings.max_body_bytes)
        convert.check_model(body.model, self.settings.accepted_models)
        req = convert.chat_request(body)
        if body.max_completion_tokens is not None:
            req.max_new_tokens = self.limits.cap_max_tokens(body.max_completion_tokens,
                                                            "max_completion_tokens")
        else:
            req.max_new_tokens = self.limits.cap_max_tokens(body.max_tokens, "max_tokens")
        return await self._openai(request, body, req, chat=True)

    async def completions(self, request: Request) -> Response:
        body = await read_body(request, CompletionRequest, self.settings.max_body_bytes)
        convert.check_model(body.model, self.settings.accepted_models)
        reqs = convert.completion_requests(body)
        for req in reqs:
            req.max_new_tokens = self.limits.cap_max_tokens(body.max_tokens, "max_tokens",
                                                            req.max_new_tokens)
        if len(reqs) > 1:
            return await self._openai_choices(request, body, reqs, body.n or 1, chat=False)
        return await self._openai(request, body, reqs[0], chat=False)

    async def generate(self, request: Request) -> Response:
        body = await read_body(request, GenerateRequest, self.settings.max_body_bytes)
        req = convert.generate_request(body)
        if body.rid is not None:  # NOTE: task-local, as the middleware's own id
            tracing.request_id.set(body.rid)
        asked = body.sampling_params.max_new_tokens
        # NOTE: the schema's default (128) cannot be told from an explicit 128: clamped
        default = asked == _GENERATE_DEFAULT_MAX
        req.max_new_tokens = self.limits.cap_max_tokens(
            None if default else asked, "sampling_params.max_new_tokens",
            asked if default else None)
        if body.sampling_params.n > 1:
            return await self._native_choices(request, body, req)
        deadline = self._prepare(request, req, body.timeout)
        if body.stream:
            gen = await run_until_disconnect(request.receive, self._submit(req, deadline))
            return sse_response(gen, native_events(gen, deadline))
        done = await run_until_disconnect(request.receive, deadline.run(self._complete(req)))
        body = native_body(done.rid, done.text, done.token_ids, done.finish_reason, done.usage,
                           done.logprobs)
        body["meta_info"]["worker"] = done.worker
        return json_response(body, worker=done.worker)

    async def _openai(self, request: Request, body, req: GenerationRequest, chat: bool) -> Response:
        if (body.n or 1) > 1:
            return await self._openai_choices(request, body, [req], body.n, chat)
        model = self.settings.served_model_name
        deadline = self._prepare(request, req, body.timeout)
        if body.stream:
            gen = await run_until_disconnect(request.receive, self._submit(req, deadline))
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            fmt = OpenAIFormat(gen.rid, model, chat, include_usage)
            lps = stream_logprobs(req, chat, gen.prompt_tokens)
            tools = bool(req.tool_mode)
            return sse_response(gen, openai_events(gen, fmt, deadline, tools, lps),
                                plain=fmt if not tools and lps is None else None)
        done = await run_until_disconnect(request.receive, deadline.run(self._complete(req)))
        return json_response(OpenAIFormat(done.rid, model, chat).response(done, req), worker=done.worker)

    async def _openai_choices(self, request: Request, body, prompts: list[GenerationRequest],
                              n: int, chat: bool) -> Response:
        """Several prompts (non-stream) and/or ``n`` choices each: choice i answers
        prompt i // n (see :mod:`.choices`)."""
        reqs = [choice for req in prompts for choice in choice_requests(req, n)]
        deadline = [self._prepare(request, req, body.timeout) for req in reqs][0]
        base = tracing.request_id.get() or uuid.uuid4().hex
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        fmt = OpenAIFormat(base, self.settings.served_model_name, chat, include_usage)

        gens = await run_until_disconnect(request.receive,
                                          deadline.run(open_choices(self._open, reqs, n, base)))
        if body.stream:
            lps = [stream_logprobs(r, chat, g.prompt_tokens) for r, g in zip(reqs, gens)]
            events = merged_events(gens, fmt, deadline, bool(reqs[0].tool_mode), lps)
            return SSEResponse(events, on_close=lambda: close_all(gens),
                               headers={WORKER_HEADER: gens[0].worker_id})
        dones = await run_until_disconnect(request.receive, deadline.run(collect_all(gens)))
        return json_response(fmt.batch_response(dones, reqs, n), worker=dones[0].worker)

    async def _native_choices(self, request: Request, body: GenerateRequest,
                              req: GenerationRequest) -> Response:
        """SGLang's ``sampling_params.n`` (not streamed): a list of /generate objects."""
        if body.stream:
            raise not_supported("sampling_params.n", " above 1 with stream")
        reqs = choice_requests(req, body.sampling_params.n)
        deadline = [self._prepare(request, r, body.timeout) for r in reqs][0]
        base = tracing.request_id.get() or uuid.uuid4().hex

        async def run() -> list[Completion]:
            return await collect_all(await open_choices(self._open, reqs, len(reqs), base))

        dones = await run_until_disconnect(request.receive, deadline.run(run()))
        return json_response([native_body(d.rid, d.text, d.token_ids, d.finish_reason, d.usage, d.logprobs)
                              for d in dones], worker=dones[0].worker)

    async def _open(self, req: GenerationRequest) -> Generation:
        """Submit ``req``; closed again (aborted) if its prompt is over the limit."""
        gen = await self.pipeline.submit(req)
        try:
            self.limits.check_prompt(gen.prompt_tokens)
        except ApiError:
            gen.close()
            raise
        return gen

    def _prepare(self, request: Request, req: GenerationRequest, timeout: float | None) -> Deadline:
        """Apply what the gateway adds to every request: tenant namespace, limits."""
        # NOTE: the one place the tenant enters the cache namespace
        req.cache_salt = tenant_salt(request_tenant(request.scope), req.cache_salt)
        if req.input_ids is not None:
            self.limits.check_prompt(len(req.input_ids))
        return self.limits.deadline(timeout)

    async def _submit(self, req: GenerationRequest, deadline: Deadline) -> Generation:
        return await deadline.run(self._open(req))

    async def _complete(self, req: GenerationRequest) -> Completion:
        gen = await self.pipeline.submit(req)
        async with gen:
            self.limits.check_prompt(gen.prompt_tokens)
            return await gen.collect()


_GENERATE_DEFAULT_MAX = SamplingParamsBody().max_new_tokens


async def openai_events(gen: Generation, fmt: OpenAIFormat, deadline: Deadline = NO_DEADLINE,
                        tools: bool = False, logprobs: LogprobStream | None = None) -> AsyncIterator[bytes]:
    """SSE chunks of an OpenAI stream (``tools``: calls parsed out of the text; ``logprobs``:
    each delta's shown with it); a failure (or the deadline) becomes an error event."""
    stream = ChoiceStream(fmt, tools=tools, logprobs=logprobs)
    async with gen:
        if fmt.chat:
            yield sse_event(fmt.chunk("", role=True))
        try:
            async for delta in deadline.iterate(gen):
                for event in stream.events(delta.text, delta.finish_reason, delta.logprobs):
                    yield event
        except ServiceError as exc:
            yield sse_event(ApiError.from_service(exc).body())
        except ApiError as exc:
            yield sse_event(exc.body())
        else:
            if fmt.include_usage:
                yield sse_event(fmt.usage_chunk(gen.final_usage()))
        yield SSE_DONE


async def native_events(gen: Generation,
                        deadline: Deadline = NO_DEADLINE) -> AsyncIterator[bytes]:
    """SGLang-style stream: each event is the cumulative /generate object."""
    async with gen:
        text = ""
        ids: list[int] = []
        try:
            async for delta in deadline.iterate(gen):
                text += delta.text
                ids.extend(delta.token_ids)
                usage = delta_usage(delta, gen.prompt_tokens, len(ids))
                body = native_body(gen.rid, text, ids, delta.finish_reason, usage)
                if delta.finish_reason is not None:
                    body["meta_info"]["worker"] = gen.worker_id
                if delta.finish_reason is not None and gen.first_token_at is not None:
                    # NOTE: the value the TTFT histogram observed, for client-side checks
                    body["meta_info"]["ttft_s"] = gen.first_token_at - gen.started
                yield sse_event(body)
        except ServiceError as exc:
            yield sse_event(ApiError.from_service(exc).body())
        except ApiError as exc:
            yield sse_event(exc.body())
        yield SSE_DONE
