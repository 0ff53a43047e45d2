"""Write docs/configuration.md from the argparse parsers themselves.

    .venv/bin/python scripts/gen_config_docs.py           # rewrite docs/configuration.md
    .venv/bin/python scripts/gen_config_docs.py --check   # exit 1 if it is out of date

The page lists ``radixmesh up``'s own flags (read from the parser ``radixmesh.cli.main``
builds) and every service's flags (read from each ``services/<name>/__main__.py`` parser
through ``radixmesh.cli_config.service_parser``), with the name each one has on
``radixmesh up`` and the environment variable ``radixmesh up`` reads it from.
tests/docs/test_configuration.py fails when the page differs from what this prints.
The parsers are read with ``NATS_URL`` and every ``RADIXMESH_*`` variable unset, so
the defaults shown are the code's, not this shell's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "configuration.md"

HEADER = """\
# Configuration reference

What this page is for: every flag of `radixmesh up` and of each service started on its own
(`python -m services.<name>`), with its default and the environment variable that sets it.
It is generated from the argparse parsers by `scripts/gen_config_docs.py`
(`tests/docs/test_configuration.py` fails when it is out of date): change a flag's help in
the code, then run `.venv/bin/python scripts/gen_config_docs.py`.

## Where a value comes from

`radixmesh up` offers every service's options next to its own, a group per service (as
`radixmesh up --help` shows them). A flag several services share is prefixed with its
service (`--scheduler-metrics-port`, `--gpu-worker-metrics-port`). Each option comes from,
first to last:

1. the flag;
2. the environment: `RADIXMESH_` + the `radixmesh up` flag in capitals, dashes as
   underscores (`RADIXMESH_SCHEDULE_POLICY`, `RADIXMESH_SCHEDULER_METRICS_PORT`,
   `RADIXMESH_WORKERS`);
3. `--config radixmesh.toml`: a table per service with the service's own option names,
   dashes or underscores, and `[up]` for `radixmesh up`'s own:

   ```toml
   [up]
   workers = 2

   [scheduler]
   schedule-policy = "lpm"
   ```

4. the service's default.

`radixmesh up --print-config` prints the merged result in the form `--config` reads back
(secrets such as the gateway's API key are never printed). A bad value or an unknown
option in the environment or the file stops `radixmesh up` with its name.

`NATS_URL=nats://host:4222` makes `radixmesh up` use an existing broker instead of starting
its own. The services inherit `radixmesh up`'s environment, so `RADIXMESH_LOG_LEVEL` and the
NATS credentials (`RADIXMESH_NATS_USER` / `_PASSWORD`, `_TOKEN`, `_CREDS`, `_NKEY_SEED`,
`_TLS_CA`, `_TLS_CERT`, `_TLS_KEY`) reach every one of them.
"""

SERVICES_INTRO = """\
## The services on their own

Each service is its own process, `python -m services.<name>` (`python -m services.<name>
--help`), and can run on any host that reaches the broker. Run on their own, the services
read their flags' defaults from the environment too: most from `RADIXMESH_<SERVICE>_<FLAG>`,
then `RADIXMESH_<FLAG>` (the names `radixmesh up` uses). The column "on `radixmesh up`" names
the flag a service option has there; "set by `radixmesh up`" means the launcher passes it
itself (the bus, the model, ids), from its own flags above.
"""

_DEFAULT_ENV = re.compile(r"^(?P<help>.*?)(?:\s*\(default: (?P<default>.*)\))?;? env (?P<env>RADIXMESH_\w+)$", re.S)
_RANDOM_ID = re.compile(r"^(?P<prefix>.*-)[0-9a-f]{8}$")


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


@contextlib.contextmanager
def _clean_environment():
    """NATS_URL and RADIXMESH_* unset while the parsers are built (their defaults read them)."""
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k == "NATS_URL" or k.startswith("RADIXMESH_")}
    try:
        yield
    finally:
        os.environ.update(saved)


def up_parser() -> argparse.ArgumentParser:
    """The ``radixmesh up`` subparser, as ``radixmesh.cli.main(["up"])`` builds it."""
    from radixmesh import cli

    def capture(self, *args, **kwargs):
        raise _Captured(self)

    saved = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = capture
    try:
        cli.main(["up"])
    except _Captured as got:
        top = got.parser
    else:  # pragma: no cover
        raise RuntimeError("radixmesh.cli.main did not parse its arguments")
    finally:
        argparse.ArgumentParser.parse_args = saved
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["up"]


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _code(text: object) -> str:
    return f"`{_cell(text)}`" if str(text) != "" else '`""`'


def _values(action: argparse.Action) -> str:
    if action.nargs == 0:
        return "switch"
    if action.choices is not None:
        return _cell(" | ".join(f"`{c}`" for c in action.choices))
    kind = getattr(action.type, "__name__", None) or "text"
    return {"str": "text", "positive_int": "int >= 1"}.get(kind, kind)


def _default(action: argparse.Action) -> str:
    default = action.default
    if action.nargs == 0:
        return "off" if not default else "on"
    if default is None or default is argparse.SUPPRESS:
        return ""
    match = _RANDOM_ID.match(str(default)) if action.dest in ("instance", "worker_id") else None
    if match:
        return f"`{match['prefix']}` + 8 random hex digits"
    return _code(default)


def _help(action: argparse.Action) -> str:
    text = action.help or ""
    with contextlib.suppress(KeyError, TypeError, ValueError):
        text = text % {"default": action.default, "prog": ""}
    return _cell(text)


def _flags(action: argparse.Action) -> str:
    return ", ".join(f"`{s}`" for s in action.option_strings)


def _up_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = ["| flag | values | default | environment | what it does |", "|---|---|---|---|---|"]
    for action in parser._actions:
        if not action.option_strings or action.dest == "help" or "." in action.dest:
            continue
        text = (action.help or "").replace("%%", "%")
        match = _DEFAULT_ENV.match(text)
        help_text, default, env = (match["help"], match["default"], match["env"]) if match else (text, None, "")
        shown = "off" if action.nargs == 0 else (_code(default) if default is not None else "")
        rows.append(f"| {_flags(action)} | {_values(action)} | {shown} | {_code(env) if env else ''} "
                    f"| {_cell(help_text)} |")
    return rows


def render() -> str:
    """The whole page."""
    from radixmesh import cli_config

    with _clean_environment():
        up = up_parser()
        own = {s for a in up._actions if "." not in a.dest for s in a.option_strings}
        options = cli_config.service_options(reserved=frozenset(own))
        parsers = {service: cli_config.service_parser(service) for service in cli_config.SERVICE_PARSERS}
    by_dest = {(o.service, o.action.dest): o for o in options}
    up_dests = {a.dest for a in up._actions if "." not in a.dest}

    out = [HEADER, "## `radixmesh up`", "",
           "`radixmesh up` starts nats-server and every service on this machine and supervises them "
           "(see the [README](../README.md#run-it)). Its own flags:", ""]
    out += _up_rows(up)
    out += ["", "Every service option below is a `radixmesh up` flag too, under the name in the "
            "column \"on `radixmesh up`\", and read from the environment variable beside it.", "",
            SERVICES_INTRO]
    for service, parser in parsers.items():
        out += [f"### `python -m services.{service}`", ""]
        if parser.description:
            what = _cell(parser.description.strip().split("\n")[0].split(": ", 1)[-1]).rstrip(".")
            out += [what[:1].upper() + what[1:] + ".", ""]
        out += ["| flag | values | default | on `radixmesh up` | environment (`radixmesh up`) | what it does |",
                "|---|---|---|---|---|---|"]
        for action in parser._actions:
            longs = [s for s in action.option_strings if s.startswith("--")]
            if not longs or action.dest == "help" or action.help == argparse.SUPPRESS:
                continue
            opt = by_dest.get((service, action.dest))
            if opt is not None:
                on_up, env = f"`{opt.flag}`", _code(opt.env) if not opt.secret else f"`{opt.secret}`"
            elif action.dest in cli_config.LAUNCHER_SET.get(service, ()) or action.dest in ("nats_url", "subject_prefix"):
                on_up = "set by `radixmesh up`" + (f" (`--{action.dest.replace('_', '-')}`)"
                                                   if action.dest in up_dests else "")
                env = ""
            else:
                on_up, env = "", ""
            out.append(f"| {_flags(action)} | {_values(action)} | {_default(action)} | {on_up} | {env} "
                       f"| {_help(action)} |")
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 if docs/configuration.md is out of date")
    args = p.parse_args(argv)
    text = render()
    if args.check:
        current = PAGE.read_text() if PAGE.exists() else ""
        if current != text:
            print(f"{PAGE.relative_to(ROOT)} is out of date: run .venv/bin/python scripts/gen_config_docs.py",
                  file=sys.stderr)
            return 1
        return 0
    PAGE.parent.mkdir(exist_ok=True)
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
