"""API keys -> tenants: who may call the gateway, and whose prefix cache they use.

Keys come from a file (``--api-keys-file`` / ``RADIXMESH_API_KEYS_FILE``), from
``RADIXMESH_API_KEYS="key1:tenantA,key2:tenantB"`` and from the single
``--api-key`` (tenant ``default``). The file is either a JSON object
``{"<key>": "<tenant>", ...}`` or text with one ``<key> <tenant>`` per line
(blank lines and ``#`` comments ignored).

A tenant is a cache namespace: :func:`tenant_salt` folds it into the request's
``cache_salt`` so two tenants never share cached KV, nor index entries.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import dataclass
from pathlib import Path

from opentelemetry import trace
from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import ApiError

DEFAULT_TENANT = "default"
_TENANT = re.compile(r"^[A-Za-z0-9._@:/+-]{1,128}$")


class KeyFileError(ValueError):
    """The keys file or env spec cannot be used (the message says where)."""


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


@dataclass(frozen=True)
class Keyring:
    """Known keys (stored as SHA-256 digests) and their tenants."""

    entries: tuple[tuple[bytes, str], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.entries)

    @property
    def tenants(self) -> frozenset[str]:
        return frozenset(t for _, t in self.entries)

    def tenant_of(self, key: str) -> str | None:
        """The key's tenant or None; compares against every key in constant time."""
        given = _digest(key)
        found: str | None = None
        for digest, tenant in self.entries:
            # NOTE: no early exit: the time does not depend on which key matched
            if hmac.compare_digest(given, digest):
                found = tenant
        return found

    @classmethod
    def build(cls, pairs: list[tuple[str, str]]) -> "Keyring":
        seen: dict[str, str] = {}
        for key, tenant in pairs:
            if not key or any(c.isspace() for c in key):
                raise KeyFileError("an API key must be non-empty and contain no whitespace")
            if not _TENANT.match(tenant):
                raise KeyFileError(f"bad tenant name {tenant!r}: use 1-128 of [A-Za-z0-9._@:/+-]")
            if seen.get(key, tenant) != tenant:
                raise KeyFileError("one API key is given for two tenants")
            seen[key] = tenant
        return cls(tuple((_digest(k), t) for k, t in seen.items()))


def parse_key_file(text: str, source: str = "keys file") -> list[tuple[str, str]]:
    """``{"key": "tenant"}`` JSON, or ``key tenant`` lines."""
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise KeyFileError(f"{source}: invalid JSON: {exc}") from None
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
            raise KeyFileError(f"{source}: expected an object of string keys to string tenants")
        return list(data.items())
    pairs = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise KeyFileError(f"{source}:{number}: expected '<key> <tenant>'")
        pairs.append((parts[0], parts[1]))
    return pairs


def parse_key_env(spec: str) -> list[tuple[str, str]]:
    """``key1:tenantA,key2:tenantB`` (a key without ``:tenant`` is tenant ``default``)."""
    pairs = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        key, sep, tenant = item.partition(":")
        pairs.append((key, tenant if sep else DEFAULT_TENANT))
    return pairs


def load_keyring(keys_file: str | Path | None = None, env_spec: str | None = None,
                 api_key: str | None = None) -> Keyring:
    """Every configured key; an empty keyring means auth is off."""
    pairs: list[tuple[str, str]] = []
    if keys_file:
        path = Path(keys_file)
        try:
            text = path.read_text()
        except OSError as exc:
            raise KeyFileError(f"cannot read API keys file {path}: {exc.strerror}") from None
        pairs += parse_key_file(text, str(path))
        if not pairs:
            raise KeyFileError(f"API keys file {path} holds no keys")
    if env_spec:
        pairs += parse_key_env(env_spec)
    if api_key:
        pairs.append((api_key, DEFAULT_TENANT))
    return Keyring.build(pairs)


def tenant_salt(tenant: str | None, cache_salt: str) -> str:
    """The cache namespace sent on the bus: tenant and salt, length-prefixed.

    NOTE: injective: no (tenant, salt) pair yields another pair's namespace.
    Without auth (tenant None) the request's own salt is kept as it is.
    """
    if tenant is None:
        return cache_salt
    return f"{len(tenant)}:{tenant}:{cache_salt}"


def tenant_digest(tenant: str) -> str:
    """What logs and traces show of a tenant."""
    return hashlib.blake2b(tenant.encode(), digest_size=6).hexdigest()


def request_tenant(scope: Scope) -> str | None:
    """The tenant the auth middleware admitted this request as (None: auth off)."""
    return scope.get("state", {}).get("tenant")


def bearer_token(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""
    return None


class AuthMiddleware:
    """401 unless ``Authorization: Bearer <key>`` names a known key; open paths pass."""

    def __init__(self, app: ASGIApp, keyring: Keyring, open_paths: frozenset[str]) -> None:
        self.app = app
        self.keyring = keyring
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        token = bearer_token(scope)
        tenant = self.keyring.tenant_of(token) if token else None
        if tenant is None:
            message = "Missing API key" if token is None else "Incorrect API key provided"
            await ApiError(401, message, code="invalid_api_key").response()(scope, receive, send)
            return
        scope.setdefault("state", {})["tenant"] = tenant
        span = trace.get_current_span()
        if span.is_recording():
            span.set_attribute("radixmesh.tenant", tenant_digest(tenant))
        await self.app(scope, receive, send)
