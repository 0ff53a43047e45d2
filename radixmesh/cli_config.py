"""``radixmesh up``'s one configuration: every service's own options, in one place.

Each service's options are read from its own parser (``python -m services.<name>``)
and offered by ``radixmesh up`` in a group per service, under the same flag: an
option several services share (``--metrics-port``) is prefixed with its service
(``--scheduler-metrics-port``). Options the launcher sets itself (the bus, the
instance and worker ids, the model, the gateway's address) stay ``radixmesh up``'s
own flags. Every option comes from, first to last:

- the flag;
- the environment: ``RADIXMESH_`` + the flag in capitals (``RADIXMESH_SCHEDULE_POLICY``,
  ``RADIXMESH_SCHEDULER_METRICS_PORT``; ``radixmesh up``'s own: ``RADIXMESH_WORKERS``);
- ``--config radixmesh.toml``: a table per service with the option's name, dashes
  or underscores (``[scheduler] schedule-policy = "lpm"``), ``[up]`` for
  ``radixmesh up``'s own;
- the service's default (what ``--print-config`` shows for options nobody set).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import tomllib
from dataclasses import dataclass
from typing import Any, Mapping

DESCRIPTION = """\
Start nats-server and every service on this machine. Every service's options are
here too, a group per service, under the service's own flag (one several services
share is prefixed with the service: --scheduler-metrics-port). Each option comes
from its flag, else the environment (RADIXMESH_ + the flag in capitals:
RADIXMESH_SCHEDULE_POLICY, RADIXMESH_WORKERS), else --config FILE.toml (a table per
service: [scheduler] schedule-policy = "lpm"; [up] for the launcher's own), else
the service's default. --print-config shows the result."""

# the services, each with the function of its __main__ that builds and parses its flags
SERVICE_PARSERS = {
    "cache_index": "main", "tokenizer": "main", "scheduler": "parse_args",
    "gpu_worker": "parse_args", "gateway": "parse_args",
}
# set by the launcher for every service (the bus, ids, logging)
COMMON = frozenset({"help", "nats_url", "subject_prefix", "instance", "log_level", "nats_user",
                    "nats_password", "nats_token", "nats_creds_file", "nats_nkey_seed_file",
                    "nats_tls_ca", "nats_tls_cert", "nats_tls_key"})
# set by the launcher from `radixmesh up`'s own flags
LAUNCHER_SET = {
    "tokenizer": {"model"}, "gateway": {"model", "host", "port", "reuse_port"},
    "gpu_worker": {"model", "dtype", "kv_slots", "threads", "worker_id", "announce_interval", "role"},
}
ENV_PREFIX = "RADIXMESH_"
# options that carry secrets: passed to the service in its own environment variable
SECRETS = {("gateway", "api_key"): "RADIXMESH_API_KEY"}


class ConfigError(ValueError):
    """A bad value or an unknown option in the environment or the config file."""


@dataclass(frozen=True)
class Option:
    """One service option as ``radixmesh up`` offers it."""

    service: str
    flag: str  # on radixmesh up: --schedule-policy, --scheduler-metrics-port
    service_flag: str  # on the service: --metrics-port
    action: argparse.Action  # the service's own (type, choices, default, help)

    @property
    def dest(self) -> str:
        return f"{self.service}.{self.action.dest}"

    @property
    def name(self) -> str:
        return self.service_flag.removeprefix("--")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.flag.removeprefix("--").replace("-", "_").upper()

    @property
    def is_switch(self) -> bool:
        return self.action.nargs == 0

    @property
    def secret(self) -> str | None:
        """The environment variable the service reads a secret from (never on its
        command line, never printed), or None."""
        return SECRETS.get((self.service, self.action.dest))

    def parse(self, value: Any, where: str) -> Any:
        """``value`` (a string from the environment, a TOML value) as the service would take it."""
        if self.is_switch:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("", "0", "false", "no", "off"):
                return False
            raise ConfigError(f"{where}: {self.name} is a switch: true or false, not {value!r}")
        try:
            parsed = self.action.type(str(value)) if self.action.type else str(value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: {self.name}: {exc}") from None
        if self.action.choices is not None and parsed not in self.action.choices:
            raise ConfigError(f"{where}: {self.name} must be one of {sorted(self.action.choices)}, "
                              f"not {value!r}")
        return parsed

    def argv(self, value: Any) -> list[str]:
        """The service's flags for ``value``."""
        if self.is_switch:
            return [self.service_flag] if value != self.action.default else []
        return [self.service_flag, str(value)]


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def service_parser(service: str, own_defaults: bool = True) -> argparse.ArgumentParser:
    """The service's own parser, built by its ``__main__`` (which is stopped as it parses)."""
    module = importlib.import_module(f"services.{service}.__main__")

    def capture(self, *args, **kwargs):
        raise _Captured(self)

    saved = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args
    argparse.ArgumentParser.parse_args = argparse.ArgumentParser.parse_known_args = capture
    # NOTE: the services read RADIXMESH_* into their defaults; here the defaults must be
    # the services' own (this module layers the environment on top, naming bad values)
    env = {k: os.environ.pop(k) for k in [k for k in os.environ if own_defaults and k.startswith(ENV_PREFIX)]}
    try:
        getattr(module, SERVICE_PARSERS[service])([])
    except _Captured as got:
        return got.parser
    finally:
        argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = saved
        os.environ.update(env)
    raise RuntimeError(f"services.{service} did not parse its arguments")


def service_options(reserved: frozenset[str] = frozenset()) -> list[Option]:
    """Every option of every service that ``radixmesh up`` passes on; ``reserved``:
    ``radixmesh up``'s own flags (a service flag of that name gets the prefix)."""
    found: list[tuple[str, str, argparse.Action]] = []
    for service in SERVICE_PARSERS:
        skip = COMMON | LAUNCHER_SET.get(service, set())
        for action in service_parser(service)._actions:
            longs = [s for s in action.option_strings if s.startswith("--")]
            if action.dest in skip or not longs or action.help == argparse.SUPPRESS:
                continue
            found.append((service, longs[0], action))
    counts: dict[str, int] = {}
    for _, flag, _ in found:
        counts[flag] = counts.get(flag, 0) + 1
    return [Option(service, flag if counts[flag] == 1 and flag not in reserved
                   else f"--{service.replace('_', '-')}-{flag[2:]}", flag, action)
            for service, flag, action in found]


def add_service_arguments(parser: argparse.ArgumentParser, options: list[Option]) -> None:
    """A group per service; every default None (unset: the environment, the file or
    the service decides)."""
    groups: dict[str, Any] = {}
    for opt in options:
        group = groups.get(opt.service) or groups.setdefault(opt.service, parser.add_argument_group(
            f"{opt.service} (python -m services.{opt.service})"))
        default = opt.action.default
        shown = "" if default in (None, False, argparse.SUPPRESS) or opt.secret else f" (default: {default})"
        try:
            help_text = (opt.action.help or "") % {"default": default}
        except (KeyError, TypeError, ValueError):
            help_text = opt.action.help or ""
        help_text = f"{help_text}{shown}; env {opt.env}".lstrip("; ").replace("%", "%%")
        kwargs: dict[str, Any] = {"dest": opt.dest, "default": None, "help": help_text}
        if opt.is_switch:
            kwargs.update(action="store_const", const=not opt.action.default)
        else:
            kwargs.update(type=opt.action.type, choices=opt.action.choices)
            if opt.action.choices is None:
                kwargs["metavar"] = opt.action.metavar or opt.name.upper().replace("-", "_")
        group.add_argument(opt.flag, **kwargs)


def load_file(path: str | None) -> dict[str, dict[str, Any]]:
    if not path:
        return {}
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"--config {path}: {exc}") from None
    for table, values in data.items():
        if not isinstance(values, dict):
            raise ConfigError(f"--config {path}: {table!r} must be a table ([{table}]), "
                              "one per service, [up] for radixmesh up's own")
    return data


def resolve(args: argparse.Namespace, own: Mapping[str, argparse.Action], options: list[Option],
            env: Mapping[str, str], file: Mapping[str, Mapping[str, Any]],
            file_name: str = "the config file") -> dict[str, dict[str, Any]]:
    """The merged configuration: ``{"up": {...}, "<service>": {...}}``, every option
    with its value (flag > environment > file > default)."""
    by_table: dict[str, dict[str, Option]] = {}
    for opt in options:
        by_table.setdefault(opt.service, {})[opt.action.dest] = opt
    for table, values in file.items():
        known = own if table == "up" else by_table.get(table)
        if known is None:
            raise ConfigError(f"{file_name}: unknown table [{table}] (have [up], "
                              f"{', '.join(f'[{s}]' for s in by_table)})")
        for key in values:
            if key.replace("-", "_") not in known:
                raise ConfigError(f"{file_name}: [{table}] has no option {key!r}")
    merged: dict[str, dict[str, Any]] = {"up": {}}
    for dest, action in own.items():
        merged["up"][dest] = _pick(getattr(args, dest), action, f"--{dest.replace('_', '-')}",
                                   env, file.get("up", {}), file_name, "up")
    for opt in options:
        value = getattr(args, opt.dest, None)
        if value is None and opt.env in env:
            value = opt.parse(env[opt.env], f"env {opt.env}")
        if value is None:
            value = _from_file(file.get(opt.service, {}), opt.action.dest, opt, file_name)
        merged.setdefault(opt.service, {})[opt.name] = opt.action.default if value is None else value
    return merged


def _pick(value: Any, action: argparse.Action, flag: str, env: Mapping[str, str],
          table: Mapping[str, Any], file_name: str, service: str) -> Any:
    """One of radixmesh up's own options: its flag if given, else env, file, default."""
    opt = Option(service, flag, flag, action)
    if value is not None:
        return value
    if opt.env in env:
        return opt.parse(env[opt.env], f"env {opt.env}")
    found = _from_file(table, action.dest, opt, file_name)
    return action.default if found is None else found


def _from_file(table: Mapping[str, Any], dest: str, opt: Option, file_name: str) -> Any:
    for key in (dest, dest.replace("_", "-")):
        if key in table:
            return opt.parse(table[key], f"{file_name} [{opt.service}] {key}")
    return None


def service_argv(merged: Mapping[str, Mapping[str, Any]],
                 options: list[Option]) -> tuple[dict[str, list[str]], dict[str, str]]:
    """The flags each service gets (the options whose value is not the service's
    default) and the environment variables that carry the secrets."""
    argv: dict[str, list[str]] = {}
    env: dict[str, str] = {}
    for opt in options:
        value = merged[opt.service][opt.name]
        if value is None or value == opt.action.default:
            continue
        if opt.secret:
            env[opt.secret] = str(value)
        else:
            argv.setdefault(opt.service, []).extend(opt.argv(value))
    return argv, env


class _Hidden:
    """A secret that is set, in what --print-config shows."""


HIDDEN = _Hidden()


def masked(merged: Mapping[str, Mapping[str, Any]], options: list[Option]) -> dict[str, dict[str, Any]]:
    """``merged`` with every secret that is set hidden."""
    out = {table: dict(values) for table, values in merged.items()}
    for opt in options:
        if opt.secret and out[opt.service].get(opt.name) is not None:
            out[opt.service][opt.name] = HIDDEN
    return out


def to_toml(merged: Mapping[str, Mapping[str, Any]]) -> str:
    """``merged`` as a config file ``--config`` reads back (unset options commented)."""
    lines: list[str] = []
    for table, values in merged.items():
        lines.append(f"[{table}]")
        for key, value in values.items():
            key = key.replace("_", "-")
            if value is None:
                lines.append(f"# {key} =")
            elif value is HIDDEN:
                lines.append(f"# {key} = (set; a secret, not shown)")
            elif isinstance(value, bool):
                lines.append(f"{key} = {str(value).lower()}")
            elif isinstance(value, (int, float)):
                lines.append(f"{key} = {value}")
            else:
                lines.append(f"{key} = {json.dumps(str(value))}")
        lines.append("")
    return "\n".join(lines)


def environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}
