"""Errors of the kernels package."""

from __future__ import annotations


class BackendNotAvailable(ValueError):
    """The named attention backend is unknown, or cannot run here (package, device or dtype missing)."""
