"""The Starlette application: routes, auth, health, models and the OpenAPI document."""

from __future__ import annotations

import hmac
import time
from typing import Awaitable, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import ApiError
from .health import HealthReport
from .observability import RequestContextMiddleware
from .openapi import openapi_document
from .routes import GatewaySettings, GenerationRoutes, Submitter, endpoint, json_response

HealthCheck = Callable[[], Awaitable[HealthReport]]
FlushCache = Callable[[], Awaitable[dict]]
Metrics = Callable[[], Awaitable[bytes]]
OPEN_PATHS = frozenset({"/health", "/openapi.json", "/metrics"})
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


class ApiKeyMiddleware:
    """401 unless ``Authorization: Bearer <key>``; health and the schema stay open."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                message = "Missing API key" if not given else "Incorrect API key provided"
                response = ApiError(401, message, code="invalid_api_key").response()
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(pipeline: Submitter, settings: GatewaySettings, health: HealthCheck,
               flush_cache: FlushCache | None = None, metrics: Metrics | None = None) -> Starlette:
    """The gateway's ASGI app; ``pipeline`` is usually a started :class:`Pipeline`,
    ``metrics`` renders the Prometheus page (``GET /metrics``; 404 without it)."""
    gen = GenerationRoutes(pipeline, settings)
    created = int(time.time())
    openapi = json_response(openapi_document()).body

    def model_card(name: str) -> dict:
        return {"id": name, "object": "model", "created": created, "owned_by": "radixmesh"}

    async def list_models(_: Request) -> Response:
        return json_response({"object": "list", "data": [model_card(settings.served_model_name)]})

    async def get_model(request: Request) -> Response:
        name = request.path_params["model"]
        if name not in settings.accepted_models:
            raise ApiError(404, f"The model `{name}` does not exist.", "model", "model_not_found")
        return json_response(model_card(name))

    async def get_health(_: Request) -> Response:
        report = await health()
        return json_response(report.body, 200 if report.ok else 503)

    async def post_flush_cache(_: Request) -> Response:
        if flush_cache is None:
            raise ApiError(404, "cache flushing is not enabled on this gateway", code="not_found")
        return json_response(await flush_cache())

    async def get_openapi(_: Request) -> Response:
        return Response(openapi, media_type="application/json")

    async def get_metrics(_: Request) -> Response:
        if metrics is None:
            raise ApiError(404, "metrics are not enabled on this gateway", code="not_found")
        return Response(await metrics(), media_type=PROMETHEUS_TEXT)

    routes = [
        Route("/v1/chat/completions", endpoint(gen.chat_completions), methods=["POST"]),
        Route("/v1/completions", endpoint(gen.completions), methods=["POST"]),
        Route("/generate", endpoint(gen.generate), methods=["POST"]),
        Route("/v1/models", endpoint(list_models), methods=["GET"]),
        Route("/v1/models/{model:path}", endpoint(get_model), methods=["GET"]),
        Route("/health", endpoint(get_health), methods=["GET"]),
        Route("/flush_cache", endpoint(post_flush_cache), methods=["POST"]),
        Route("/openapi.json", get_openapi, methods=["GET"]),
        Route("/metrics", endpoint(get_metrics), methods=["GET"]),
    ]
    static = frozenset(r.path for r in routes if "{" not in r.path)
    middleware = [Middleware(RequestContextMiddleware, routes=static)]
    if settings.api_key:
        middleware.append(Middleware(ApiKeyMiddleware, api_key=settings.api_key))
    app = Starlette(routes=routes, middleware=middleware,
                    exception_handlers={HTTPException: _http_error})
    app.state.pipeline = pipeline
    app.state.settings = settings
    return app


async def _http_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return ApiError(exc.status_code, exc.detail, code="not_found" if exc.status_code == 404 else None
                    ).response()
