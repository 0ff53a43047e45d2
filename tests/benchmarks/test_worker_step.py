"""The in-process step benchmark: its system specs (dtype:mode:threads[:attention[:knobs]]) and its table."""

from __future__ import annotations

import argparse

import pytest

from radixmesh.benchmarks.worker_step import label, main, parse_system

from ..gpu_worker.models.test_llama_model import SMALL, _save_random


def test_attention_backend_and_knobs_are_optional():
    none = frozenset()
    assert parse_system("bf16:eager:1:cpu_v1") == ("bfloat16", "eager", 1, "cpu_v1", none)
    assert parse_system("fp32:compiled:2") == ("float32", "compiled", 2, "auto", none)
    both = parse_system("bf16:eager:2:cpu:fp32-attn+torch-ops")
    assert both == ("bfloat16", "eager", 2, "cpu", frozenset({"torch-ops", "fp32-attn"}))
    assert label(parse_system("bf16:eager:1:cpu_v1")) == "bf16 eager 1t cpu_v1"
    assert label(parse_system("fp32:plain:1")) == "fp32 plain 1t"
    assert label(both) == "bf16 eager 2t cpu torch-ops fp32-attn"


@pytest.mark.parametrize("bad", ["bf16:fast:1", "int8:eager:1", "bf16:eager:1:cpu:extra", "bf16:eager:1:cpu:torch-ops:x",
                                 "bf16:eager:1:cpu:torch-ops+x"])
def test_bad_systems_are_refused(bad):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_system(bad)


def test_the_table_has_the_prefill_row_and_the_knobs_ratio(tmp_path, capsys):
    from transformers import LlamaConfig, LlamaForCausalLM

    _save_random(LlamaForCausalLM(LlamaConfig(**SMALL)), tmp_path)
    main(["--model", str(tmp_path), "--systems", "bf16:eager:1:cpu,bf16:eager:1:cpu:torch-ops+fp32-attn",
          "--batches", "1,2", "--context", "4", "--steps", "1", "--rounds", "1", "--prefill", "8"])
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("| batch |"))
    assert lines[at].split(" | ")[1:] == ["bf16 eager 1t cpu", "bf16 eager 1t cpu torch-ops fp32-attn",
                                          "bf16 eager 1t cpu / bf16 eager 1t cpu torch-ops fp32-attn |"]
    table = lines[at + 2 : lines.index("", at)]
    rows = {line.split(" | ")[0]: line.split(" | ")[1:] for line in table}
    assert list(rows) == ["| 1", "| 2", "| prefill 8"]
    assert all(float(cell.strip(" |")) > 0 for cells in rows.values() for cell in cells)
    shares = lines.index(next(line for line in lines if line.startswith("share of the linears' roofline")))
    share_rows = {line.split(" | ")[0]: line.split(" | ")[1:] for line in lines[shares + 3: shares + 6]}
    assert list(share_rows) == ["| 1", "| 2", "| prefill 8"]
    for cells in share_rows.values():  # a share of a bound: positive, and no figure beats its roofline
        assert all(0 < float(cell.strip(" |")) <= 1.0 for cell in cells)
