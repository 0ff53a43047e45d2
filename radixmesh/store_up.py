"""``radixmesh up --kv-store mooncake``: the stack starts its own ``mooncake_master`` (a
supervised child, on a free port) unless the workers are given a master (``--kv-store-url``)."""

from __future__ import annotations

from pathlib import Path

MOONCAKE = "mooncake_master"


def _flag(args: list[str], flag: str) -> str | None:
    """The last value of ``flag`` in ``args`` (``--flag v`` or ``--flag=v``), or None."""
    value = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def wants_master(worker_args: list[str]) -> bool:
    return _flag(worker_args, "--kv-store") == "mooncake" and not _flag(worker_args, "--kv-store-url")


def start_master(log_dir: Path, host: str = "127.0.0.1"):
    """A started :class:`MooncakeMaster` writing ``log_dir/mooncake_master.log``."""
    from libs.transfer.mooncake_master import MooncakeMaster

    return MooncakeMaster(host=host, log_file=log_dir / f"{MOONCAKE}.log").start()
