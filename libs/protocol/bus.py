"""The transport wrapper: every service talks to NATS through :class:`Bus`.

It encodes/decodes typed messages, turns handler exceptions into typed error
replies (and error replies back into :class:`ServiceError`), and carries W3C
trace context in NATS headers on every publish and request.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import time
from typing import Any, Awaitable, Callable, Iterable, TypeVar

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import (
    ConnectionClosedError, ConnectionDrainingError, ConnectionReconnectingError, NoRespondersError,
    OutboundBufferLimitError,
)
from nats.errors import TimeoutError as NatsTimeout

from . import codec, errors, faults, tracing
from .credentials import NatsCredentials
from .errors import ServiceError
from .messages import Base, ErrorInfo
from .servers import Backoff, parse_servers

T = TypeVar("T")
Handler = Callable[[Any], Awaitable[Base | None]]

log = logging.getLogger("radixmesh.bus")

_STATUS_HEADER = "Rm-Status"


class _Link:
    """A client's reconnects as requests need them: nats-py reports itself connected
    before it has replayed its subscriptions (its reply inbox among them), so a request
    sent in between loses its reply; requests wait for the replay (``reconnected_cb``)."""

    def __init__(self) -> None:
        self.ready = asyncio.Event()
        self.ready.set()
        self.reconnected_at = float("-inf")  # monotonic
        self.server = ""  # host:port of the server it is (or was last) connected to
        self.nc: Client | None = None

    def note_server(self) -> None:
        url = self.nc.connected_url if self.nc is not None else None
        if url is not None:
            self.server = url.netloc

    def last_server(self) -> str:
        return self.server

    async def on_disconnect(self) -> None:
        self.ready.clear()

    async def on_reconnect(self) -> None:
        self.reconnected_at = time.monotonic()
        self.note_server()
        self.ready.set()

    async def settled(self, limit: float) -> bool:
        if self.ready.is_set():
            return True
        try:
            await asyncio.wait_for(self.ready.wait(), limit)
        except asyncio.TimeoutError:
            return False
        return True


class Bus:
    """A connected NATS client with typed, traced request/reply and pub/sub."""

    def __init__(self, nc: Client, name: str, link: _Link | None = None) -> None:
        self.nc = nc
        self.name = name
        self._tasks: set[asyncio.Task] = set()
        self._link = link or _Link()
        self._faults = faults.from_env()  # NOTE: empty unless a test asks for dropped messages

    MAX_CONCURRENT = 1024  # handlers in flight per concurrent subscription
    DRAIN_TIMEOUT_S = 3.0  # close() gives up draining (a broker gone mid-drain) after this
    # after a reconnect the other services resubscribe at their own pace (each retries every
    # 0.5 s): for this long "no responders" is retried (every 50 ms, within the request's timeout)
    RESUBSCRIBE_S = 3.0

    # NOTE: nats-py's default (120 s x 2) lets a powered-off host (no TCP reset) stall its
    # peers for ~4 minutes; these notice a silent server in PING_S x (MAX_PINGS + 1)
    PING_S = float(os.environ.get("RADIXMESH_NATS_PING_S", "2"))
    MAX_PINGS = 2
    BACKOFF = Backoff()

    @classmethod
    async def connect(cls, url: str | Iterable[str], name: str, connect_timeout: float = 5.0,
                      credentials: NatsCredentials | None = None) -> "Bus":
        """Connect to one of the servers ``url`` names (comma-separated or a list: a cluster),
        retrying while none is reachable, and fail over among them (and those the cluster
        announces) afterwards.

        ``credentials`` default to the environment (:meth:`NatsCredentials.from_env`); a
        user or token written inside a URL is used for every server. Refused credentials or
        a failed TLS handshake raise :class:`BusAuthError` at once instead of retrying forever.
        """
        servers = parse_servers(url)
        creds = NatsCredentials.from_env() if credentials is None else credentials
        creds = creds.with_url_auth(servers.user, servers.password, servers.token)
        refused: asyncio.Future[Exception] = asyncio.get_running_loop().create_future()
        nc = Client()
        link = _Link()
        link.nc = nc

        async def on_error(exc: Exception) -> None:
            if not nc.is_connected and _fatal(exc) and not refused.done():
                refused.set_result(exc)
            log.warning("nats error (%s): %s", name, exc)

        connecting = asyncio.ensure_future(nc.connect(
            servers=list(servers.urls),
            name=name,
            connect_timeout=connect_timeout,
            allow_reconnect=True,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            reconnect_to_server_handler=cls.BACKOFF.handler(link.last_server),
            ping_interval=cls.PING_S,
            max_outstanding_pings=cls.MAX_PINGS,
            error_cb=on_error,
            disconnected_cb=link.on_disconnect,
            reconnected_cb=link.on_reconnect,
            **creds.connect_options(),
        ))
        try:
            await asyncio.wait((connecting, refused), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # NOTE: the caller gave up (a deadline): stop retrying
            connecting.cancel()
            await asyncio.wait((connecting,))
            await nc.close()
            raise
        if not connecting.done():
            connecting.cancel()
            await asyncio.wait((connecting,))
            await nc.close()
            raise BusAuthError(f"NATS at {servers} refused {name}: {refused.result()} (check "
                               "RADIXMESH_NATS_USER/PASSWORD/TOKEN/CREDS and the TLS files)")
        connecting.result()
        link.note_server()
        return cls(nc, name, link)

    @property
    def reconnected_at(self) -> float:
        """When (monotonic) this client last reconnected: what it heard before may be stale."""
        return self._link.reconnected_at

    def broker(self) -> dict[str, str]:
        """The NATS node this client is on now and the cluster it sees (for /health, pongs)."""
        info = getattr(self.nc, "_server_info", None) or {}  # NOTE: nats-py keeps INFO private
        url = self.nc.connected_url
        peers = {u for u in info.get("connect_urls") or ()}
        return {
            "nats_server": str(info.get("server_name") or info.get("server_id") or ""),
            "nats_url": url.netloc if url else "",
            "nats_cluster": str(info.get("cluster") or ""),
            # NOTE: connect_urls lists the cluster's client URLs, this node's among them
            "nats_nodes": str(max(len(peers), 1) if url else 0),
        }

    async def close(self) -> None:
        """Drain and close; never raises (the broker may be gone or reconnecting)."""
        for task in list(self._tasks):
            task.cancel()
        if self.nc.is_closed:
            return
        try:
            if self.nc.is_connected:  # NOTE: drain raises while (re)connecting
                await asyncio.wait_for(self.nc.drain(), self.DRAIN_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - closing is best effort
            log.debug("drain (%s) failed: %r", self.name, exc)
        try:
            if not self.nc.is_closed:
                await self.nc.close()
        except Exception as exc:  # noqa: BLE001 - e.g. a reset socket while flushing
            log.debug("close (%s) failed: %r", self.name, exc)

    async def publish(self, subject: str, msg: Base) -> None:
        if not tracing.in_trace():  # NOTE: per-step traffic: no span, so no headers to make
            await self.nc.publish(subject, codec.encode(msg))
            return
        with tracing.producer_span(subject, "publish"):
            headers = tracing.inject_headers()
            await self.nc.publish(subject, codec.encode(msg), headers=headers or None)

    async def request(self, subject: str, msg: Base, reply_type: type[T], timeout: float = 5.0) -> T:
        """Send ``msg`` and decode the reply; raises ServiceError on any failure."""
        with tracing.producer_span(subject, "send"):
            headers = tracing.inject_headers() if tracing.in_trace() else None
            if not self.nc.is_connected:  # NOTE: fail fast instead of waiting out the timeout
                raise broker_unavailable(subject)
            if not await self._link.settled(min(timeout, self.RESUBSCRIBE_S)):
                raise broker_unavailable(subject)
            try:
                reply = await self._request(subject, codec.encode(msg), timeout, headers or None)
            except NoRespondersError:
                raise errors.unavailable(f"no service is listening on {subject}") from None
            except NatsTimeout:
                if not self.nc.is_connected:
                    raise broker_unavailable(subject) from None
                raise errors.timeout(f"no reply on {subject} within {timeout:.1f}s") from None
            except _DISCONNECTED:
                raise broker_unavailable(subject) from None
            # NOTE: inside the span, so a typed error reply marks it failed
            return _decode_reply(reply, reply_type)

    async def _request(self, subject: str, data: bytes, timeout: float, headers) -> Msg:
        """One request; "no responders" retried while the broker's other clients may still be
        resubscribing (``RESUBSCRIBE_S`` after this one reconnected)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return await self.nc.request(subject, data, timeout=max(deadline - time.monotonic(), 0.01),
                                             headers=headers)
            except NoRespondersError:
                now = time.monotonic()
                if now - self._link.reconnected_at > self.RESUBSCRIBE_S or now + 0.05 >= deadline:
                    raise
                await asyncio.sleep(0.05)

    async def subscribe(
        self,
        subject: str,
        handler: Handler,
        msg_type: Any,
        queue: str = "",
        concurrent: bool = False,
    ) -> Subscription:
        """Call ``handler(decoded)`` per message; a returned Struct is the reply.

        Messages of one subscription are handled in order unless ``concurrent``.
        """

        # NOTE: at most MAX_CONCURRENT handlers run per subscription; past that the
        # callback waits, so messages queue within nats-py's pending limits
        slots = asyncio.Semaphore(self.MAX_CONCURRENT)

        async def on_msg(raw: Msg) -> None:
            if self._faults and faults.should_drop(self._faults, raw.subject):
                return
            if concurrent:
                await slots.acquire()
                task = asyncio.create_task(self._handle(raw, handler, msg_type))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                task.add_done_callback(lambda _: slots.release())
            else:
                await self._handle(raw, handler, msg_type)

        return await self.nc.subscribe(subject, queue=queue, cb=on_msg)

    async def _handle(self, raw: Msg, handler: Handler, msg_type: Any) -> None:
        with tracing.consumer_span(raw.subject, raw.headers):
            try:
                msg = codec.decode(raw.data, msg_type)
                result = await handler(msg)
            except ServiceError as exc:
                await self._reply_error(raw, exc.info())
                return
            except msgspec.ValidationError as exc:
                await self._reply_error(raw, errors.invalid_request(f"bad message: {exc}").info())
                return
            except msgspec.DecodeError as exc:
                await self._reply_error(raw, errors.invalid_request(f"undecodable: {exc}").info())
                return
            except Exception as exc:  # noqa: BLE001 - every failure gets a typed reply
                log.exception("handler for %s failed", raw.subject)
                await self._reply_error(raw, errors.internal(f"{type(exc).__name__}: {exc}").info())
                return
            if raw.reply and result is not None:
                await self.nc.publish(raw.reply, codec.encode(result))

    async def _reply_error(self, raw: Msg, info: ErrorInfo) -> None:
        tracing.handler_failed(raw.subject, info.code, info.message)
        if not raw.reply:
            log.warning("dropped %s: %s", raw.subject, info.message)
            return
        await self.nc.publish(raw.reply, codec.encode(info), headers={_STATUS_HEADER: "error"})


class BusAuthError(ConnectionError):
    """The broker refused this service's credentials or its TLS handshake failed."""


def _fatal(exc: Exception) -> bool:
    """Errors that retrying cannot fix: bad credentials, bad certificates."""
    return isinstance(exc, ssl.SSLError) or "authorization violation" in str(exc).lower() \
        or "authentication" in str(exc).lower()


_DISCONNECTED = (ConnectionClosedError, ConnectionDrainingError, ConnectionReconnectingError,
                 OutboundBufferLimitError)


def broker_unavailable(subject: str) -> ServiceError:
    """The bus has no broker connection right now (503: retry later)."""
    return ServiceError("broker_unavailable",
                        f"not connected to the message broker; cannot send to {subject}", 503)


def _decode_reply(reply: Msg, reply_type: type[T]) -> T:
    if reply.headers and reply.headers.get(_STATUS_HEADER) == "error":
        raise ServiceError.from_info(codec.decode(reply.data, ErrorInfo))
    try:
        return codec.decode(reply.data, reply_type)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise errors.internal(f"malformed reply on {reply.subject}: {exc}") from None
