"""SGLang's and vLLM's utility endpoints: /version, /get_model_info,
/get_server_info, /health_generate and /abort_request.

``/health_generate`` runs a one-token generation through every service (tokenizer,
index, scheduler, worker, detokenizer): 200 when it comes back, 503 with a JSON
error otherwise. ``/abort_request`` ends an open request of this gateway by its
id (``x-request-id``, an OpenAI ``chatcmpl-``/``cmpl-`` id, or /generate's
``rid``) the way a client disconnect does: its scheduler stops it and its
response ends with finish_reason ``abort``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.metadata
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Protocol

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from libs.protocol import ServiceError

from .errors import ApiError
from .request import GenerationRequest
from .sampling import unresolved
from .schemas import AbortBody

HEALTH_PROMPT = "ping"
HEALTH_TIMEOUT_S = 20.0
_ID_PREFIXES = ("chatcmpl-", "cmpl-")


def version() -> str:
    try:
        return importlib.metadata.version("radixmesh")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class Backend(Protocol):
    async def submit(self, req: GenerationRequest): ...

    def abort(self, rid: str) -> bool: ...


@dataclass(frozen=True)
class ServerInfo:
    """What /get_model_info and /get_server_info report."""

    model_path: str  # the model's directory (the default's in the cache folder)
    config: dict  # the gateway's effective configuration, secrets left out
    workers: Callable[[], Awaitable[list[dict]]] | None = None  # the live workers, when reachable


def public_config(*configs) -> dict:
    """Dataclass configs flattened into one dict; keys and key files are left out."""
    out: dict = {}
    for config in configs:
        for f in dataclasses.fields(config):
            value = getattr(config, f.name)
            if f.name in ("api_key", "keyring"):
                out[f"{f.name}_set"] = bool(value)
            elif dataclasses.is_dataclass(value):
                out.update(public_config(value))
            else:
                out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


class UtilityRoutes:
    def __init__(self, backend: Backend, served_model_name: str, info: ServerInfo,
                 read_body: Callable[[Request, type], Awaitable]) -> None:
        self.backend, self.name, self.info, self.read_body = backend, served_model_name, info, read_body

    async def version(self, _: Request) -> dict:
        return {"version": version()}

    async def model_info(self, _: Request) -> dict:
        return {"model_path": self.info.model_path, "tokenizer_path": self.info.model_path,
                "served_model_name": self.name, "is_generation": True,
                "preferred_sampling_params": None, "weight_version": "default",
                "has_image_understanding": False, "has_audio_understanding": False}

    async def server_info(self, _: Request) -> dict:
        body = {**self.info.config, "model_path": self.info.model_path, "version": version()}
        if self.info.workers is not None:
            try:
                body["workers"] = await self.info.workers()
            except ServiceError as exc:
                body["workers_error"] = exc.message
        return body

    async def health_generate(self, _: Request) -> dict:
        """One greedy token through the whole stack, within ``HEALTH_TIMEOUT_S``."""
        started = time.perf_counter()
        try:
            done = await asyncio.wait_for(self._one_token(), HEALTH_TIMEOUT_S)
        except ServiceError as exc:
            raise ApiError(503, f"health generation failed: {exc.message}", code="unhealthy") from None
        except TimeoutError:
            raise ApiError(503, f"health generation took over {HEALTH_TIMEOUT_S:g}s",
                           code="unhealthy") from None
        return {"status": "ok", "worker": done.worker, "completion_tokens": len(done.token_ids),
                "latency_s": round(time.perf_counter() - started, 4)}

    async def _one_token(self):
        gen = await self.backend.submit(GenerationRequest(
            text=HEALTH_PROMPT, add_generation_prompt=False, max_new_tokens=1, params=unresolved(temperature=0.0)))
        async with gen:
            return await gen.collect()

    async def abort_request(self, request: Request) -> dict:
        body = await self.read_body(request, AbortBody)
        rid = body.rid
        for prefix in _ID_PREFIXES:
            rid = rid.removeprefix(prefix)
        if not self.backend.abort(rid):
            raise ApiError(404, f"no open request with id {body.rid!r} on this gateway", "rid",
                           "request_not_found")
        return {"aborted": body.rid}

    def routes(self, endpoint: Callable, json_response: Callable) -> list[Route]:
        def json(fn):
            async def handler(request: Request) -> Response:
                return json_response(await fn(request))
            return endpoint(handler)

        return [
            Route("/version", json(self.version), methods=["GET"]),
            Route("/get_model_info", json(self.model_info), methods=["GET"]),
            Route("/get_server_info", json(self.server_info), methods=["GET"]),
            Route("/health_generate", json(self.health_generate), methods=["GET"]),
            Route("/abort_request", json(self.abort_request), methods=["POST"]),
        ]
