"""Kernel tests: the Triton interpreter on a CPU-only machine, fresh random inputs with a printed seed,
and the ``level`` fixture: a test that takes it runs once per ISA level of the C++ kernels this
CPU executes (on an AVX-512 machine the AVX2 build's paths too); every other test runs the
level the machine loads by default."""

from __future__ import annotations

import os
import random

import pytest
import torch

from libs.kernels import cpu_ext

# NOTE: must precede the first import of the Triton kernels (triton.jit reads it when they are defined)
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
LEVELS = cpu_ext.runnable_levels()


@pytest.fixture(params=LEVELS or [pytest.param(None, marks=pytest.mark.skip(reason="no C++ kernel level runs here"))])
def level(request) -> str:
    """One ISA level this CPU executes: within the test, ``cpu_ext.load()`` (and so every kernel
    wrapper and the cpu backend) gives that level's build."""
    with cpu_ext.using(request.param):
        yield request.param


@pytest.fixture()
def gen() -> torch.Generator:
    """A generator with a fresh seed each run; the seed is printed, so a failing test shows it."""
    seed = int(os.environ.get("KERNEL_TEST_SEED", random.randrange(2**31)))
    print(f"seed={seed} (rerun with KERNEL_TEST_SEED={seed})")
    return torch.Generator().manual_seed(seed)


@pytest.fixture(autouse=True)
def _one_thread():
    """The machine is shared: keep each test on one core."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
