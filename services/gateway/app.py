"""The Starlette application: routes, auth, health, models and the OpenAPI document."""

from __future__ import annotations

import time
from typing import Awaitable, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .auth import AuthMiddleware, Keyring, load_keyring
from .errors import ApiError
from .health import HealthReport
from .limits import ConcurrencyLimit
from .observability import RequestContextMiddleware
from .openapi import openapi_document
from .routes import GatewaySettings, GenerationRoutes, Submitter, endpoint, json_response, read_body
from .sse import RAW_SEND
from .utility import ServerInfo, UtilityRoutes, public_config

HealthCheck = Callable[[], Awaitable[HealthReport]]
FlushCache = Callable[[], Awaitable[dict]]
Metrics = Callable[[], Awaitable[bytes]]
OPEN_PATHS = frozenset({"/health", "/openapi.json", "/metrics"})
GENERATION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/generate"})
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


class GatewayApp(Starlette):
    """Starlette that leaves the server's own ``send`` in the scope: a stream's plain
    chunks go straight to the connection (sse.chunk_writer), under the middleware."""

    async def __call__(self, scope, receive, send) -> None:
        scope[RAW_SEND] = send
        await super().__call__(scope, receive, send)


def create_app(pipeline: Submitter, settings: GatewaySettings, health: HealthCheck,
               flush_cache: FlushCache | None = None, metrics: Metrics | None = None,
               info: ServerInfo | None = None) -> GatewayApp:
    """The gateway's ASGI app; ``pipeline`` is usually a started :class:`Pipeline`,
    ``metrics`` renders the Prometheus page (``GET /metrics``; 404 without it),
    ``info`` what /get_model_info and /get_server_info say (default: the settings)."""
    gen = GenerationRoutes(pipeline, settings)
    info = info or ServerInfo(settings.served_model_name, public_config(settings))
    utility = UtilityRoutes(pipeline, settings.served_model_name, info,
                            lambda request, kind: read_body(request, kind, settings.max_body_bytes))
    created = int(time.time())
    keyring = _keyring(settings)
    openapi = json_response(openapi_document(models=tuple(settings.accepted_models),
                                             secured=bool(keyring))).body

    def model_card(name: str) -> dict:
        return {"id": name, "object": "model", "created": created, "owned_by": "radixmesh"}

    async def ready() -> None:
        """NOTE: clients poll /v1/models for readiness: it answers 200 only when
        /health does, i.e. once a generation can be served."""
        report = await health()
        if not report.ok:
            detail = report.body.get("detail") or report.body.get("status", "starting")
            raise ApiError(503, f"not ready to serve generations: {detail}", code="not_ready")

    async def list_models(_: Request) -> Response:
        await ready()
        return json_response({"object": "list", "data": [model_card(settings.served_model_name)]})

    async def get_model(request: Request) -> Response:
        await ready()
        name = request.path_params["model"]
        if name not in settings.accepted_models:
            raise ApiError(404, f"The model `{name}` does not exist.", "model", "model_not_found")
        return json_response(model_card(name))

    async def get_health(_: Request) -> Response:
        report = await health()
        response = json_response(report.body, 200 if report.ok else 503)
        if not report.ok:
            response.headers["Retry-After"] = "1"
        return response

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
        *utility.routes(endpoint, json_response),
    ]
    static = frozenset(r.path for r in routes if "{" not in r.path)
    middleware = [Middleware(RequestContextMiddleware, routes=static)]
    if keyring:
        middleware.append(Middleware(AuthMiddleware, keyring=keyring, open_paths=OPEN_PATHS))
    if settings.limits.max_concurrent_requests:
        middleware.append(Middleware(ConcurrencyLimit, paths=GENERATION_PATHS,
                                     limit=settings.limits.max_concurrent_requests))
    app = GatewayApp(routes=routes, middleware=middleware,
                    exception_handlers={HTTPException: _http_error})
    app.state.pipeline = pipeline
    app.state.settings = settings
    return app


def _keyring(settings: GatewaySettings) -> Keyring:
    keyring = settings.keyring or Keyring()
    if settings.api_key:  # the single --api-key joins whatever else is configured
        keyring = Keyring(keyring.entries + load_keyring(api_key=settings.api_key).entries)
    return keyring


async def _http_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return ApiError(exc.status_code, exc.detail, code="not_found" if exc.status_code == 404 else None
                    ).response()
