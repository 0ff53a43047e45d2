"""The default page store: a NATS JetStream KV bucket (no new service: the broker is there).

The bucket's stream is configured here, not by nats-py's ``create_key_value`` (which
sets discard-new: puts fail once the bucket is full)::

    KV_<bucket>: subjects $KV.<bucket>.>, one value per key (history 1), max_bytes,
                 discard old (a full bucket drops its oldest pages), allow_direct

Reads are direct gets (``$JS.API.DIRECT.GET``: answered by any replica, the value as the
message body; ~4-5x the default get, which base64s it in JSON). ``direct=False`` keeps the
default get for comparison. Membership is a stream-info request filtered on the key's
subject (no value moves). Any KV client reads the bucket (``nats kv get``).
"""

from __future__ import annotations

import base64
import json
import logging
from dataclasses import replace

from nats.aio.client import Client
from nats.errors import ConnectionClosedError, ConnectionDrainingError, ConnectionReconnectingError, NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js import api
from nats.js.errors import APIError, BadRequestError, NotFoundError, ServiceUnavailableError

from libs.protocol.limits import KV_STORE_BUCKET

from .errors import StoreError, StoreUnavailable
from .store import PageSpec, PageStore

log = logging.getLogger("radixmesh.store")

DEFAULT_BUCKET = KV_STORE_BUCKET
DEFAULT_MAX_BYTES = 4 << 30
_STREAM_IN_USE = 10058  # JetStream: stream name already in use with a different configuration
_NO_MESSAGE = 10037
_FAILURES = (NatsTimeout, NoRespondersError, ConnectionClosedError, ConnectionDrainingError,
             ConnectionReconnectingError, ServiceUnavailableError, TimeoutError, OSError)


def cluster_nodes(nc: Client) -> int:
    """How many nodes the cluster behind ``nc`` has (1: a single server)."""
    info = getattr(nc, "_server_info", None) or {}  # NOTE: nats-py keeps INFO private
    return max(len(set(info.get("connect_urls") or ())), 1)


def default_replicas(nc: Client) -> int:
    """R3 where the cluster has 3 nodes or more (a page survives a node), else R1."""
    return 3 if cluster_nodes(nc) >= 3 else 1


def stream_config(bucket: str, max_bytes: int, storage: str = "file", replicas: int = 1) -> api.StreamConfig:
    return api.StreamConfig(
        name=f"KV_{bucket}", subjects=[f"$KV.{bucket}.>"], allow_direct=True, allow_rollup_hdrs=True,
        deny_delete=True, discard=api.DiscardPolicy.OLD, max_bytes=max_bytes, max_msgs_per_subject=1,
        max_msgs=-1, max_consumers=-1, storage=api.StorageType(storage), num_replicas=replicas,
    )


class JetStreamStore(PageStore):
    """Pages in bucket ``bucket`` over the connection ``nc`` (not closed by :meth:`close`)."""

    def __init__(self, nc: Client, spec: PageSpec, bucket: str = DEFAULT_BUCKET, direct: bool = True,
                 timeout_s: float = 2.0, in_flight: int = 8) -> None:
        super().__init__(spec, timeout_s, in_flight)
        self.nc = nc
        self.bucket = bucket
        self.stream = f"KV_{bucket}"
        self.direct = direct
        self.js = nc.jetstream(timeout=timeout_s)

    @classmethod
    async def open(cls, nc: Client, spec: PageSpec, bucket: str = DEFAULT_BUCKET,
                   max_bytes: int = DEFAULT_MAX_BYTES, storage: str = "file", replicas: int = 0,
                   **options) -> "JetStreamStore":
        """The store on bucket ``bucket``, its stream created (or fixed: discard old, direct
        get, ``replicas`` copies; 0: :func:`default_replicas`) first. Raises PageTooLarge when a page exceeds the broker's max_payload,
        StoreUnavailable when JetStream does not answer (not enabled: nats-server -js)."""
        spec.require_fits(nc.max_payload, f"the NATS server at {nc.connected_url.netloc if nc.connected_url else '?'}"
                                           " (max_payload)")
        store = cls(nc, spec, bucket, **options)
        await store._ensure_stream(stream_config(bucket, max_bytes, storage, replicas or default_replicas(nc)))
        return store

    async def _ensure_stream(self, config: api.StreamConfig) -> None:
        jsm = self.js  # JetStreamContext is a JetStreamManager
        try:
            await jsm.add_stream(config)
            return
        except _FAILURES as exc:
            raise StoreUnavailable(f"JetStream did not answer ({type(exc).__name__}): is it enabled "
                                   "on the broker (nats-server -js)?") from None
        except APIError as exc:
            if config.num_replicas > 1 and exc.err_code != _STREAM_IN_USE:
                # NOTE: fewer nodes than replicas (a node per advertised URL overcounts hosts
                # with several addresses): one copy serves; the next open asks for R3 again
                log.warning("bucket %s: %s replicas refused (%s); keeping one", self.bucket,
                            config.num_replicas, exc)
                await self._ensure_stream(replace(config, num_replicas=1))
                return
            if not isinstance(exc, BadRequestError) or exc.err_code != _STREAM_IN_USE:
                raise StoreError(f"JetStream refused the stream of bucket {self.bucket}: {exc}") from None
        have = (await jsm.stream_info(self.stream)).config
        if have.max_bytes != config.max_bytes:
            log.warning("bucket %s keeps its byte limit %s (asked for %s)", self.bucket, have.max_bytes,
                        config.max_bytes)
        if not have.allow_direct or have.discard != api.DiscardPolicy.OLD or have.max_msgs_per_subject != 1:
            log.warning("bucket %s: setting discard old, history 1 and direct get", self.bucket)
            have = have.evolve(allow_direct=True, discard=api.DiscardPolicy.OLD, max_msgs_per_subject=1)
            await jsm.update_stream(have)
        if (have.num_replicas or 1) != config.num_replicas:
            log.warning("bucket %s: %s replicas -> %s", self.bucket, have.num_replicas or 1, config.num_replicas)
            try:
                await jsm.update_stream(have.evolve(num_replicas=config.num_replicas))
            except APIError as exc:  # e.g. fewer nodes up now than asked for: serve as it is
                log.warning("bucket %s keeps %s replicas: %s", self.bucket, have.num_replicas or 1, exc)

    def subject(self, key: str) -> str:
        return f"$KV.{self.bucket}.{key}"

    async def _request(self, subject: str, payload: bytes = b""):
        if not self.nc.is_connected:  # NOTE: fail fast rather than wait out the timeout
            raise StoreUnavailable(f"not connected to the NATS server of bucket {self.bucket}")
        try:
            return await self.nc.request(subject, payload, timeout=self.timeout_s)
        except _FAILURES as exc:
            raise StoreUnavailable(f"bucket {self.bucket}: {type(exc).__name__} within {self.timeout_s}s") from None

    async def _exists(self, key: str) -> bool:
        reply = await self._request(f"$JS.API.STREAM.INFO.{self.stream}",
                                    json.dumps({"subjects_filter": self.subject(key)}).encode())
        info = self._answer(reply.data)
        return bool((info.get("state") or {}).get("subjects"))

    async def _get(self, key: str) -> bytes | None:
        if not self.direct:
            return await self._get_default(key)
        reply = await self._request(f"$JS.API.DIRECT.GET.{self.stream}.{self.subject(key)}")
        headers = reply.headers or {}
        if not reply.data:
            status = headers.get("Status")
            if status in ("404", None):
                return None
            raise StoreUnavailable(f"bucket {self.bucket}: direct get answered {status} {headers.get('Description', '')}")
        if headers.get("KV-Operation") in ("DEL", "PURGE"):
            return None
        return reply.data

    async def _get_default(self, key: str) -> bytes | None:
        reply = await self._request(f"$JS.API.STREAM.MSG.GET.{self.stream}",
                                    json.dumps({"last_by_subj": self.subject(key)}).encode())
        message = self._answer(reply.data, allow_missing=True)
        if message is None:
            return None
        return base64.b64decode(message.get("data", ""))

    def _answer(self, data: bytes, allow_missing: bool = False) -> dict | None:
        """A JetStream API answer (the message of a get); an error is StoreUnavailable
        (e.g. the bucket was deleted), a missing message None where ``allow_missing``."""
        try:
            reply = _api_reply(data)
        except NotFoundError:
            if allow_missing:
                return None
            raise StoreUnavailable(f"bucket {self.bucket}: not found") from None
        except APIError as exc:
            raise StoreUnavailable(f"bucket {self.bucket}: {exc}") from None
        return reply.get("message") if allow_missing else reply

    async def _set(self, key: str, value: bytes) -> bool:
        reply = await self._request(self.subject(key), value)
        try:
            _api_reply(reply.data)
        except APIError as exc:
            log.warning("put %s refused: %s", key, exc)
            return False
        return True


def _api_reply(data: bytes) -> dict:
    """A JetStream API answer; raises NotFoundError (no such message) or APIError."""
    reply = json.loads(data)
    error = reply.get("error")
    if error:
        if error.get("err_code") == _NO_MESSAGE:
            raise NotFoundError(**error)
        raise APIError(**error)
    return reply
