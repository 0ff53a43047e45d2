"""How a service proves itself to NATS: user/password, token, creds/nkey file, TLS.

Every service reads the same environment (or the matching ``--nats-*`` flag,
see :func:`libs.protocol.service.add_common_args`), so a launcher only passes env:

==============================  ==========================================
RADIXMESH_NATS_USER/_PASSWORD   user and password (``authorization`` block)
RADIXMESH_NATS_TOKEN            a bearer token
RADIXMESH_NATS_CREDS            a ``.creds`` file (JWT + nkey; needs ``nkeys``)
RADIXMESH_NATS_NKEY_SEED        an nkey seed file (needs ``nkeys``)
RADIXMESH_NATS_TLS_CA           CA bundle that signed the server (turns TLS on)
RADIXMESH_NATS_TLS_CERT/_KEY    client certificate and key (mutual TLS)
==============================  ==========================================
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, fields, replace
from typing import Any

ENV = {
    "user": "RADIXMESH_NATS_USER",
    "password": "RADIXMESH_NATS_PASSWORD",
    "token": "RADIXMESH_NATS_TOKEN",
    "creds_file": "RADIXMESH_NATS_CREDS",
    "nkey_seed_file": "RADIXMESH_NATS_NKEY_SEED",
    "tls_ca": "RADIXMESH_NATS_TLS_CA",
    "tls_cert": "RADIXMESH_NATS_TLS_CERT",
    "tls_key": "RADIXMESH_NATS_TLS_KEY",
}


@dataclass(frozen=True)
class NatsCredentials:
    """Connect options for ``nats.connect``; all empty means an open broker."""

    user: str | None = None
    password: str | None = None
    token: str | None = None
    creds_file: str | None = None
    nkey_seed_file: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> "NatsCredentials":
        env = os.environ if environ is None else environ
        return cls(**{name: env.get(var) or None for name, var in ENV.items()})

    def with_url_auth(self, user: str | None, password: str | None, token: str | None) -> "NatsCredentials":
        """These credentials, completed by those a server URL carried (explicit options win)."""
        if self.user is None and self.token is None and (user is not None or token is not None):
            return replace(self, user=user, password=password if user is not None else None, token=token)
        return self

    def env(self) -> dict[str, str]:
        """The environment that makes a child service connect like this."""
        return {ENV[f.name]: getattr(self, f.name) for f in fields(self) if getattr(self, f.name)}

    @property
    def tls(self) -> bool:
        return bool(self.tls_ca or self.tls_cert)

    def ssl_context(self) -> ssl.SSLContext:
        """Verifies the server against ``tls_ca`` (or the system store)."""
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.tls_ca)
        if self.tls_cert:
            ctx.load_cert_chain(self.tls_cert, self.tls_key)
        return ctx

    def connect_options(self) -> dict[str, Any]:
        """Keyword arguments for ``nats.connect`` (files are checked here: a clear error)."""
        if (self.user is None) != (self.password is None):
            raise ValueError("NATS user and password must be given together")
        if self.tls_key and not self.tls_cert:
            raise ValueError("a NATS TLS key needs its certificate (RADIXMESH_NATS_TLS_CERT)")
        for path in (self.creds_file, self.nkey_seed_file, self.tls_ca, self.tls_cert, self.tls_key):
            if path and not os.path.isfile(path):
                raise FileNotFoundError(f"NATS credentials file not found: {path}")
        opts: dict[str, Any] = {}
        if self.user is not None:
            opts.update(user=self.user, password=self.password)
        if self.token:
            opts["token"] = self.token
        if self.creds_file:
            opts["user_credentials"] = self.creds_file
        if self.nkey_seed_file:
            opts["nkeys_seed"] = self.nkey_seed_file
        if self.tls:
            opts["tls"] = self.ssl_context()
        return opts
