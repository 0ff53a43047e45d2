"""`radixmesh up`'s one configuration: flags, environment and --config resolve to the
same thing, every service option is reachable, and what a service is handed parses
with the service's own parser to the value asked for."""

from __future__ import annotations

import os
import tomllib

import pytest

from radixmesh import cli, cli_config
from radixmesh.cli_config import COMMON, LAUNCHER_SET, SERVICE_PARSERS, service_parser

UP_OWN = {"model", "dtype", "kv_slots", "threads", "host", "port"}  # up's flags for LAUNCHER_SET


def print_config(capsys, monkeypatch, argv: list[str], env: dict[str, str] | None = None) -> dict:
    for name in [k for k in os.environ if k.startswith("RADIXMESH_")]:
        monkeypatch.delenv(name)
    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)
    assert cli.main(["up", *argv, "--print-config"]) == 0
    return tomllib.loads(capsys.readouterr().out)


def test_flags_environment_and_file_resolve_to_the_same_configuration(capsys, monkeypatch, tmp_path):
    default = print_config(capsys, monkeypatch, [])
    flags = print_config(capsys, monkeypatch, [
        "--workers", "3", "--schedule-policy", "lpm", "--disable-radix-cache",
        "--scheduler-metrics-port", "9101", "--max-tokens-cap", "64", "--policy", "round_robin",
        "--gpu-worker-max-model-len", "1024", "--compile", "on"])
    env = print_config(capsys, monkeypatch, [], {
        "RADIXMESH_WORKERS": "3", "RADIXMESH_SCHEDULE_POLICY": "lpm",
        "RADIXMESH_DISABLE_RADIX_CACHE": "1", "RADIXMESH_SCHEDULER_METRICS_PORT": "9101",
        "RADIXMESH_MAX_TOKENS_CAP": "64", "RADIXMESH_POLICY": "round_robin",
        "RADIXMESH_GPU_WORKER_MAX_MODEL_LEN": "1024", "RADIXMESH_COMPILE": "on"})
    config = tmp_path / "radixmesh.toml"
    config.write_text('[up]\nworkers = 3\n[scheduler]\nschedule-policy = "lpm"\n'
                      'disable_radix_cache = true\nmetrics-port = 9101\n[gateway]\nmax-tokens-cap = 64\n'
                      '[cache_index]\npolicy = "round_robin"\n[gpu_worker]\nmax-model-len = 1024\n'
                      'compile = "on"\n')
    from_file = print_config(capsys, monkeypatch, ["--config", str(config)])
    assert flags == env == from_file != default
    assert flags["up"]["workers"] == 3 and flags["scheduler"]["schedule-policy"] == "lpm"
    assert flags["scheduler"]["metrics-port"] == 9101 and flags["tokenizer"]["metrics-port"] == 0
    # first the flag, then the environment, then the file
    mixed = print_config(capsys, monkeypatch, ["--config", str(config), "--workers", "5"],
                         {"RADIXMESH_SCHEDULE_POLICY": "dfs-weight", "RADIXMESH_WORKERS": "4"})
    assert mixed["up"]["workers"] == 5 and mixed["scheduler"]["schedule-policy"] == "dfs-weight"
    assert mixed["scheduler"]["page-size"] == 16 and mixed["gateway"]["max-tokens-cap"] == 64
    # what --print-config prints is a config file that gives the same again
    config.write_text(cli_config.to_toml(flags))
    assert print_config(capsys, monkeypatch, ["--config", str(config)]) == flags


def test_every_service_option_is_reachable_from_radixmesh_up():
    options = cli_config.service_options()
    by_service = {(o.service, o.action.dest) for o in options}
    for service in SERVICE_PARSERS:
        for action in service_parser(service)._actions:
            if action.dest in COMMON or not action.option_strings or action.help == "==SUPPRESS==":
                continue
            if action.dest in LAUNCHER_SET.get(service, ()):
                assert action.dest in UP_OWN | {"worker_id", "announce_interval", "role", "reuse_port"}, (service, action.dest)
            else:
                assert (service, action.dest) in by_service, (service, action.dest)


def test_what_a_service_is_handed_parses_to_the_value_asked_for(monkeypatch, capsys):
    for name in [k for k in os.environ if k.startswith("RADIXMESH_")]:
        monkeypatch.delenv(name)
    options = cli_config.service_options()
    args = cli_config_args(["--schedule-policy", "lpm", "--disable-overlap-schedule",
                            "--scheduler-metrics-port", "9101", "--encode-threads", "2",
                            "--request-deadline", "30", "--api-key", "sekrit"], options)
    merged = cli_config.resolve(args, {}, options, {}, {})
    argv, env = cli_config.service_argv(merged, options)
    assert argv["scheduler"] == ["--metrics-port", "9101", "--schedule-policy", "lpm",
                                 "--disable-overlap-schedule"]
    parsed = service_parser("scheduler").parse_args(argv["scheduler"])
    assert (parsed.metrics_port, parsed.schedule_policy, parsed.disable_overlap_schedule) == (9101, "lpm", True)
    assert service_parser("tokenizer").parse_args(argv["tokenizer"]).encode_threads == 2
    assert service_parser("gateway").parse_args(argv["gateway"]).request_deadline == 30.0
    assert "cache_index" not in argv and "sekrit" not in " ".join(sum(argv.values(), []))
    assert env == {"RADIXMESH_API_KEY": "sekrit"}  # a secret goes in the environment, not in ps
    shown = cli_config.to_toml(cli_config.masked(merged, options))
    assert "sekrit" not in shown and "# api-key = (set; a secret, not shown)" in shown


def cli_config_args(argv: list[str], options):
    import argparse

    parser = argparse.ArgumentParser()
    cli_config.add_service_arguments(parser, options)
    return parser.parse_args(argv)


@pytest.mark.parametrize("argv, env, file, message", [
    ([], {"RADIXMESH_PAGE_SIZE": "big"}, "", "env RADIXMESH_PAGE_SIZE: page-size"),
    ([], {"RADIXMESH_SCHEDULE_POLICY": "fastest"}, "", "schedule-policy must be one of"),
    ([], {"RADIXMESH_DISABLE_RADIX_CACHE": "maybe"}, "", "a switch"),
    ([], {}, "[sched]\npage-size = 8\n", "unknown table [sched]"),
    ([], {}, "[scheduler]\npage-sise = 8\n", "[scheduler] has no option 'page-sise'"),
    ([], {}, "workers = 2\n", "'workers' must be a table"),
    ([], {}, "[up]\nworkers = \"two\"\n", "workers"),
    ([], {}, "[up\n", "--config"),
])
def test_bad_values_are_refused_naming_where_they_came_from(capsys, monkeypatch, tmp_path, argv, env,
                                                          file, message):
    for name in [k for k in os.environ if k.startswith("RADIXMESH_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if file:
        (tmp_path / "c.toml").write_text(file)
        argv = [*argv, "--config", str(tmp_path / "c.toml")]
    assert cli.main(["up", *argv, "--print-config"]) == 2
    assert message in capsys.readouterr().err


def test_index_replicas_start_that_many_cache_indexes(capsys, monkeypatch, tmp_path):
    from radixmesh.launcher import LocalStack, ephemeral_stack_config

    assert print_config(capsys, monkeypatch, ["--index-replicas", "3"])["up"]["index-replicas"] == 3
    stack = LocalStack(ephemeral_stack_config(tmp_path, index_replicas=3), progress=lambda m: None)
    spawned: list[tuple[str, list[str], str | None]] = []
    monkeypatch.setattr(stack, "_spawn", lambda service, args, log_name=None:
                        spawned.append((service, args, log_name)))
    stack._spawn_all("model-dir")
    index = [(args, log) for service, args, log in spawned if service == "cache_index"]
    assert [log for _, log in index] == ["cache_index", "cache_index-1", "cache_index-2"]
    assert len({args[args.index("--instance") + 1] for args, _ in index}) == 3  # one id each


def test_gateways_and_tokenizers_follow_the_cores():
    from radixmesh.launcher import per_cores

    assert [per_cores(c) for c in (1, 2, 7, 8, 16, 31, 64, 512)] == [1, 1, 1, 1, 2, 3, 8, 8]
