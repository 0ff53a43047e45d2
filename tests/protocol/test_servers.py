"""The server list every service takes: one URL or a cluster's, credentials lifted out of
the URLs into options, bad entries named; reconnect pacing with jitter."""

from __future__ import annotations

import pytest

from libs.protocol.credentials import NatsCredentials
from libs.protocol.servers import Backoff, ServerListError, parse_servers


def test_a_cluster_comma_separated_becomes_a_list():
    s = parse_servers("nats://a:4222, nats://b:4223 ,c:4224")
    assert s.urls == ("nats://a:4222", "nats://b:4223", "nats://c:4224")
    assert (s.user, s.password, s.token) == (None, None, None)
    assert str(s) == "nats://a:4222,nats://b:4223,nats://c:4224"


def test_credentials_inside_urls_become_options_for_every_server():
    s = parse_servers("nats://bob:s%40cret@a:4222,nats://bob:s%40cret@b:4222")
    assert s.urls == ("nats://a:4222", "nats://b:4222")
    assert (s.user, s.password) == ("bob", "s@cret")
    creds = NatsCredentials().with_url_auth(s.user, s.password, s.token)
    assert creds.connect_options() == {"user": "bob", "password": "s@cret"}
    assert parse_servers("nats://tok@a:1").token == "tok"


def test_explicit_credentials_win_over_the_urls():
    s = parse_servers("nats://bob:x@a:4222")
    creds = NatsCredentials(token="given").with_url_auth(s.user, s.password, s.token)
    assert creds.connect_options() == {"token": "given"}


@pytest.mark.parametrize("spec, words", [
    ("", "no NATS server"),
    (" , ", "no NATS server"),
    ("http://a:4222", "bad NATS URL"),
    ("nats://a:notaport", "bad NATS URL"),
    ("nats://u:1@a:1,nats://v:2@b:1", "different credentials"),
])
def test_bad_lists_are_refused_with_the_entry_named(spec, words):
    with pytest.raises(ServerListError, match=words):
        parse_servers(spec)


def test_backoff_tries_a_fresh_server_at_once_and_spreads_retries():
    b = Backoff(base_s=0.25, cap_s=4.0, jitter=0.5)  # NOTE: explicit, not the defaults
    assert b.delay(0) == 0.0
    delays = [b.delay(1) for _ in range(200)]
    assert 0.125 <= min(delays) < max(delays) <= 0.375 and len(set(delays)) > 100
    assert all(2.0 <= b.delay(9) <= 6.0 for _ in range(50))  # capped, still jittered


def test_backoff_handler_picks_the_least_failed_server_and_the_lost_one_last():
    from urllib.parse import urlsplit

    class S:
        def __init__(self, netloc, reconnects):
            self.uri, self.reconnects = urlsplit(f"nats://{netloc}"), reconnects

    pick = Backoff().handler(lambda: "b:1")
    chosen, delay = pick([S("a:1", 3), S("b:1", 0), S("c:1", 1)], {})
    assert chosen.uri.netloc == "b:1" and delay == 0.0  # the only fresh one, even if lost
    chosen, delay = pick([S("b:1", 0), S("c:1", 0)], {})
    assert chosen.uri.netloc == "c:1" and delay == 0.0
