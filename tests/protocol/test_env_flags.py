"""Every option of the gateway and the tokenizer reads RADIXMESH_<FLAG> (as radixmesh up names it)."""

from __future__ import annotations

import pytest

from libs.protocol.env_flags import env_default, env_names, positive_int
from radixmesh.cli_config import service_options, service_parser

OWN_ENV = {"host": "RADIXMESH_GATEWAY_HOST", "port": "RADIXMESH_GATEWAY_PORT"}  # older names, kept
VALUES = {int: "7", positive_int: "7", float: "2.5", None: "x-7"}


def test_the_names_are_radixmesh_ups():
    assert env_names("tokenizer", "--max-model-len") == ("RADIXMESH_TOKENIZER_MAX_MODEL_LEN",
                                                         "RADIXMESH_MAX_MODEL_LEN")


def test_the_service_prefixed_name_wins(monkeypatch):
    monkeypatch.setenv("RADIXMESH_MAX_MODEL_LEN", "100")
    assert env_default("tokenizer", "--max-model-len", None, int) == 100
    monkeypatch.setenv("RADIXMESH_TOKENIZER_MAX_MODEL_LEN", "200")
    assert env_default("tokenizer", "--max-model-len", None, int) == 200
    monkeypatch.setenv("RADIXMESH_TOKENIZER_MAX_MODEL_LEN", "lots")
    with pytest.raises(SystemExit, match="RADIXMESH_TOKENIZER_MAX_MODEL_LEN"):
        env_default("tokenizer", "--max-model-len", None, int)


@pytest.mark.parametrize("service", ["gateway", "tokenizer", "scheduler", "cache_index", "gpu_worker"])
def test_every_option_radixmesh_up_passes_reads_its_env_name(service, monkeypatch):
    options = [o for o in service_options() if o.service == service and not o.is_switch and not o.secret]
    assert options
    for opt in options:
        value = VALUES.get(opt.action.type, "x-7")
        if opt.action.choices:
            value = str(sorted(opt.action.choices)[-1])
        monkeypatch.setenv(OWN_ENV.get(opt.action.dest, opt.env), value)
        got = getattr(service_parser(service, own_defaults=False).parse_args([]), opt.action.dest)
        assert got == opt.parse(value, "test"), (opt.env, got)
        monkeypatch.delenv(OWN_ENV.get(opt.action.dest, opt.env))


def test_positive_int_refuses_zero_from_the_environment(monkeypatch):
    assert positive_int("3") == 3
    monkeypatch.setenv("RADIXMESH_STREAM_INTERVAL", "0")
    with pytest.raises(SystemExit, match="RADIXMESH_STREAM_INTERVAL"):
        env_default("scheduler", "--stream-interval", 1, positive_int)
