"""A service flag's default from the environment, under the names ``radixmesh up`` uses
(radixmesh/cli_config.py): ``RADIXMESH_<FLAG>`` (capitals, dashes as underscores), and
first ``RADIXMESH_<SERVICE>_<FLAG>``, the name of an option several services share."""

from __future__ import annotations

import os
from typing import Callable, TypeVar

T = TypeVar("T")
PREFIX = "RADIXMESH_"


def env_names(service: str, flag: str) -> tuple[str, str]:
    name = flag.removeprefix("--").replace("-", "_").upper()
    return f"{PREFIX}{service.upper()}_{name}", f"{PREFIX}{name}"


def env_default(service: str, flag: str, default: T, kind: Callable[[str], T] = str) -> T:
    """``kind(value)`` of the first of :func:`env_names` that is set (and not empty), else ``default``."""
    for name in env_names(service, flag):
        value = os.environ.get(name)
        if value:
            try:
                return kind(value)
            except ValueError:
                raise SystemExit(f"{name}={value!r}: not a valid value for {flag}") from None
    return default


def positive_int(text: str) -> int:
    """A flag's type: an integer of at least 1 (ValueError otherwise, which argparse, the
    environment and ``radixmesh up``'s config file all report as a bad value)."""
    value = int(text)
    if value < 1:
        raise ValueError(f"must be at least 1, got {value}")
    return value
