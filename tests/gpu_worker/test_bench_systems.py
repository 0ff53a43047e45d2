"""The in-process decode benchmark's system specs: dtype:mode:threads[:attention]."""

from __future__ import annotations

import argparse

import pytest

from services.gpu_worker.bench import label, parse_system


def test_attention_backend_is_optional():
    assert parse_system("bf16:eager:1:cpu_v1") == ("bfloat16", "eager", 1, "cpu_v1")
    assert parse_system("fp32:compiled:2") == ("float32", "compiled", 2, "auto")
    assert label(parse_system("bf16:eager:1:cpu_v1")) == "bf16 eager 1t cpu_v1"
    assert label(parse_system("fp32:plain:1")) == "fp32 plain 1t"


@pytest.mark.parametrize("bad", ["bf16:fast:1", "int8:eager:1", "bf16:eager:1:cpu:extra"])
def test_bad_systems_are_refused(bad):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_system(bad)
