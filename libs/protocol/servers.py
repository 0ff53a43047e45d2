"""The NATS servers a service connects to, as it is given them.

``NATS_URL`` / ``--nats-url`` names one server or a cluster, comma-separated (NATS's own
convention): ``nats://a:4222,nats://b:4222,nats://c:4222``. nats-py wants a list, and it
does not reuse credentials written inside one URL for the servers it learns from the
cluster, so a user or token found in a URL is lifted out into the connect options, where it
applies to every server; the URLs it hands on carry none.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Iterable
from urllib.parse import unquote, urlsplit

SCHEMES = ("nats", "tls", "ws", "wss")


class ServerListError(ValueError):
    """A server list that cannot be used; the message names the entry."""


@dataclass(frozen=True)
class ServerList:
    urls: tuple[str, ...]  # without credentials
    user: str | None = None  # from the URLs, if any carried them
    password: str | None = None
    token: str | None = None

    def __str__(self) -> str:
        return ",".join(self.urls)


def parse_servers(spec: str | Iterable[str]) -> ServerList:
    """``spec``: a comma-separated string or a list of URLs (``host:port`` means nats://)."""
    parts = spec.split(",") if isinstance(spec, str) else list(spec)
    urls: list[str] = []
    found: set[tuple[str | None, str | None, str | None]] = set()
    for part in (p.strip() for p in parts):
        if not part:
            continue
        url, creds = _one(part)
        urls.append(url)
        if creds != (None, None, None):
            found.add(creds)
    if not urls:
        raise ServerListError("no NATS server given (NATS_URL / --nats-url is empty)")
    if len(found) > 1:
        raise ServerListError("the NATS URLs carry different credentials; give them once as options "
                              "(RADIXMESH_NATS_USER/_PASSWORD or RADIXMESH_NATS_TOKEN)")
    user, password, token = found.pop() if found else (None, None, None)
    return ServerList(tuple(urls), user, password, token)


def _one(text: str) -> tuple[str, tuple[str | None, str | None, str | None]]:
    if "://" not in text:
        text = f"nats://{text}"
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise ServerListError(f"bad NATS URL {text!r}: {exc}") from None
    if parts.scheme not in SCHEMES or not parts.hostname:
        raise ServerListError(f"bad NATS URL {text!r}: want nats://host:port (schemes: {', '.join(SCHEMES)})")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    url = f"{parts.scheme}://{host}" + (f":{port}" if port else "")
    user = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password is not None else None
    if user is not None and password is None:  # nats://TOKEN@host
        return url, (None, None, user)
    return url, (user, password, None)


@dataclass(frozen=True)
class Backoff:
    """Reconnect pacing: a server not yet tried since the link dropped is tried at once
    (fail over fast); one that failed waits ``base`` doubled per failure up to ``cap``,
    with jitter, so a cluster's clients do not all return to a restarted node together."""

    base_s: float = 0.25
    cap_s: float = 2.0
    jitter: float = 0.5  # +- this share of the delay

    def delay(self, failures: int) -> float:
        if failures <= 0:
            return 0.0
        d = min(self.base_s * 2 ** (failures - 1), self.cap_s)
        return d * random.uniform(1 - self.jitter, 1 + self.jitter)

    def handler(self, avoid: "Callable[[], str]"):
        """nats-py's ``reconnect_to_server_handler``: the least-failed server (the one just
        lost last among equals: a silent node still accepts TCP and would cost a whole
        connect timeout), and its delay. ``avoid()`` names the lost server's host:port."""

        def pick(servers, _info):
            lost = avoid()
            best = min(servers, key=lambda s: (s.reconnects, s.uri.netloc == lost))
            return best, self.delay(best.reconnects)

        return pick
