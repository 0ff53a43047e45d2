"""NATS credentials and TLS: right ones connect, wrong ones are refused at once."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from libs.protocol import Bus, ServiceError, Subjects
from libs.protocol.bus import BusAuthError
from libs.protocol.credentials import ENV, NatsCredentials
from libs.protocol.messages import Ping, Pong
from radixmesh.natsd import NatsServer, ServerTls

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def secured_nats(tmp_path_factory):
    log = tmp_path_factory.mktemp("nats") / "nats.log"
    with NatsServer(user="alice", password="s3cret pass", log_file=log) as server:
        yield server


async def _roundtrip(bus: Bus, prefix: str) -> Pong:
    subjects = Subjects(prefix)

    async def on_ping(_: Ping) -> Pong:
        return Pong(service="t", instance="i", uptime_s=1.0)

    await bus.subscribe(subjects.ping("t"), on_ping, Ping)
    return await bus.request(subjects.ping("t"), Ping(), Pong, timeout=2.0)


def test_env_roundtrip_and_checks(tmp_path):
    creds = NatsCredentials(user="u", password="p", tls_ca=str(tmp_path / "missing.pem"))
    assert NatsCredentials.from_env(creds.env()) == creds
    assert set(creds.env()) == {ENV["user"], ENV["password"], ENV["tls_ca"]}
    assert NatsCredentials.from_env({}) == NatsCredentials()
    assert NatsCredentials().connect_options() == {}
    with pytest.raises(FileNotFoundError, match="missing.pem"):
        creds.connect_options()
    with pytest.raises(ValueError, match="together"):
        NatsCredentials(user="u").connect_options()
    assert NatsCredentials(token="t").connect_options() == {"token": "t"}


async def test_right_credentials_work(secured_nats, subject_prefix):
    bus = await Bus.connect(secured_nats.url, "test", credentials=secured_nats.client_credentials())
    try:
        assert (await _roundtrip(bus, subject_prefix)).instance == "i"
    finally:
        await bus.close()


@pytest.mark.parametrize("creds", [
    NatsCredentials(user="alice", password="wrong"),
    NatsCredentials(),
    NatsCredentials(token="not-a-user"),
], ids=["wrong-password", "none", "token"])
async def test_wrong_credentials_are_refused_fast(secured_nats, creds):
    started = time.monotonic()
    with pytest.raises(BusAuthError, match="Authorization Violation"):
        await Bus.connect(secured_nats.url, "intruder", credentials=creds)
    assert time.monotonic() - started < 3.0


async def test_credentials_come_from_env(secured_nats, subject_prefix, monkeypatch):
    for var, value in secured_nats.client_credentials().env().items():
        monkeypatch.setenv(var, value)
    bus = await Bus.connect(secured_nats.url, "from-env")
    try:
        await _roundtrip(bus, subject_prefix)
    finally:
        await bus.close()


def _service(url: str, prefix: str, env: dict[str, str]) -> subprocess.Popen:
    clean = {k: v for k, v in os.environ.items() if k not in ENV.values()}
    return subprocess.Popen(
        [sys.executable, "-m", "services.cache_index", "--nats-url", url, "--subject-prefix", prefix],
        env={**clean, **env}, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )


async def test_service_with_wrong_password_exits_with_clear_error(secured_nats, subject_prefix):
    proc = _service(secured_nats.url, subject_prefix,
                    {ENV["user"]: "alice", ENV["password"]: "wrong"})
    out, _ = await asyncio.to_thread(proc.communicate, timeout=60)
    assert proc.returncode == 2
    assert b"cannot connect to NATS" in out and b"Authorization Violation" in out
    assert b"wrong" not in out  # the password is never logged


async def test_service_with_env_credentials_serves(secured_nats, subject_prefix):
    proc = _service(secured_nats.url, subject_prefix, secured_nats.client_credentials().env())
    bus = await Bus.connect(secured_nats.url, "probe", credentials=secured_nats.client_credentials())
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                pong = await bus.request(Subjects(subject_prefix).ping("cache_index"), Ping(), Pong, 1.0)
                break
            except ServiceError:  # not subscribed yet
                assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
                await asyncio.sleep(0.3)
        assert pong.service == "cache_index"
    finally:
        await bus.close()
        proc.terminate()
        await asyncio.to_thread(proc.wait, 10)


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory) -> ServerTls:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed: no certificate for the TLS test")
    d = tmp_path_factory.mktemp("tls")
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem"),
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True)
    return ServerTls(cert=str(d / "cert.pem"), key=str(d / "key.pem"))


async def test_tls_roundtrip_and_untrusted_server(self_signed, subject_prefix, tmp_path):
    with NatsServer(user="bob", password="pw", tls=self_signed,
                    log_file=tmp_path / "nats.log") as server:
        creds = server.client_credentials()
        assert creds.tls_ca == self_signed.cert
        bus = await Bus.connect(server.url, "tls-client", credentials=creds)
        try:
            await _roundtrip(bus, subject_prefix)
        finally:
            await bus.close()
        # without the CA the server's certificate is not trusted: refused, not retried
        with pytest.raises(BusAuthError):
            await Bus.connect(server.url, "tls-client", credentials=NatsCredentials(
                user="bob", password="pw", tls_ca=None, tls_cert=None))
