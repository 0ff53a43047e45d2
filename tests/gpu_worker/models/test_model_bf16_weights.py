"""ModelRunner in fp32 over bf16 weight tiles (``linear_kernel="tiles"`` under fp32, AVX2).

The weights are rounded to bf16 once; everything else (activations, KV, attention, sums)
stays fp32. So against HF in fp32 with the *same rounded weights* the math is the same up
to the order of fp32 sums: logits agree to fp32 tolerance and greedy decoding is identical,
as the fp32 parity tests demand. Against HF's unrounded fp32 weights (the default model's
are dequantized GGUF values, not bf16 ones: ~0.1% relative rounding) greedy picks differ
only near ties; the agreement figure asserted below is the one docs/cpu-kernels.md states.
"""

from __future__ import annotations

import pytest
import torch

from libs.kernels import gemm
from libs.protocol.messages import ForwardBatch, NewRow
from services.gpu_worker import ModelRunner, RunnerConfig
from services.gpu_worker.models.weights import HYBRID_ROWS, fp32_copy_fits

from .test_model_bf16 import NEW_TOKENS, PROMPTS, TEXT
from ..test_model_runner import GREEDY, _generate, _hf_greedy, _Slots

pytestmark = pytest.mark.skipif(not gemm.f32_available(), reason="needs the C++ kernels on a CPU with AVX2 and FMA")


@pytest.fixture(scope="module")
def tiles_runner(runner) -> ModelRunner:
    return ModelRunner(RunnerConfig(model=str(runner.path), kv_slots=2048, max_requests=16, dtype="float32",
                                    linear_kernel="tiles"))


@pytest.fixture(scope="module")
def hybrid_runner(runner) -> ModelRunner:
    return ModelRunner(RunnerConfig(model=str(runner.path), kv_slots=2048, max_requests=16, dtype="float32",
                                    linear_kernel="tiles+onednn"))


@pytest.fixture(scope="module")
def hf_rounded(tiles_runner):
    """HF in fp32 with every linear weight rounded to bf16, as the tiles hold them."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiles_runner.path, dtype=torch.float32).eval()
    with torch.no_grad():
        for module in hf.modules():
            if isinstance(module, torch.nn.Linear):  # NOTE: q/k/v/o, gate/up/down and the LM head
                # NOTE: a weight of its own: the LM head is tied to the embedding, whose lookup stays fp32
                module.weight = torch.nn.Parameter(module.weight.bfloat16().float())
    return hf


def _last_logits(runner, ids: list[int]) -> torch.Tensor:
    batch = ForwardBatch(step=0, new_rows=[NewRow(row=1, **GREEDY)], rows=[1], prefix_lens=[0],
                         extend_lens=[len(ids)], input_ids=ids, out_slots=list(range(len(ids))))
    return runner.logits(batch)[0]


def test_the_runner_holds_bf16_tiles_and_fp32_everything_else(tiles_runner):
    w = tiles_runner.model.weights
    assert tiles_runner.model.linear_kernel == "tiles" and isinstance(w.layers[0].gate_up, gemm.TiledWeight)
    assert isinstance(w.lm_head, gemm.TiledWeight) and w.embed.dtype == torch.float32  # the lookup stays fp32
    assert tiles_runner.kv.k[0].dtype == torch.float32


@pytest.mark.parametrize("kernel", ["tiles", "tiles+onednn"])
def test_logits_match_hf_with_the_same_rounded_weights(kernel, tiles_runner, hybrid_runner, hf_rounded, tokenizer):
    ids = tokenizer(" ".join([TEXT] * 2))["input_ids"]
    assert len(ids) >= HYBRID_ROWS  # tiles+onednn: the prompt's linears on oneDNN, the LM head's row on the tiles
    with torch.no_grad():
        ref = hf_rounded(torch.tensor([ids])).logits[0, -1].float()
    runner = tiles_runner if kernel == "tiles" else hybrid_runner
    assert runner.model.linear_kernel == kernel
    err = float((_last_logits(runner, ids) - ref).abs().max() / ref.abs().max())
    assert err < 1e-4, f"relative error {err:.2e}"  # the fp32 parity tests' bound


def test_greedy_decode_is_hfs_with_the_same_rounded_weights(tiles_runner, hf_rounded, tokenizer):
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS]
    ours = _generate(tiles_runner, prompts, list(range(len(prompts))), _Slots(tiles_runner.config.kv_slots),
                     NEW_TOKENS)
    refs = [_hf_greedy(hf_rounded, ids, NEW_TOKENS) for ids in prompts]
    assert ours == refs


def test_greedy_decode_against_unrounded_fp32_weights(tiles_runner, hf_model, tokenizer):
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS]
    ours = _generate(tiles_runner, prompts, list(range(len(prompts))), _Slots(tiles_runner.config.kv_slots),
                     NEW_TOKENS)
    refs = [_hf_greedy(hf_model, ids, NEW_TOKENS) for ids in prompts]
    same = sum(o == r for o, r in zip(ours, refs))
    print(f"bf16 weights vs fp32: {same} of {len(prompts)} identical over {NEW_TOKENS} tokens")
    assert same >= 14, same


def test_dtype_auto_takes_them_on_a_cpu_without_native_bf16_and_float32_does_not(runner, monkeypatch):
    from services.gpu_worker.models import precision

    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    auto = ModelRunner(RunnerConfig(model=str(runner.path), kv_slots=64, max_requests=2))
    # both forms where the fp32 copy fits a quarter of the free memory, the tiles alone where not
    kernel = "tiles+onednn" if fp32_copy_fits(auto.model.weights) else "tiles"
    assert auto.config.dtype == "float32" and auto.model.linear_kernel == kernel
    assert "bf16" in auto.dtype_choice.reason
    assert auto.config.kv_dtype == "bfloat16" and auto.kv.k[0].dtype == torch.bfloat16  # KV rounded as the weights
    assert runner.model.linear_kernel == "onednn"  # the parity fixture: float32 asked for


@pytest.fixture(scope="module")
def bf16_kv_runner(runner) -> ModelRunner:
    """dtype auto's pick on AVX2: the tiles, and KV kept in bf16."""
    return ModelRunner(RunnerConfig(model=str(runner.path), kv_slots=2048, max_requests=16, dtype="float32",
                                    linear_kernel="tiles", kv_dtype="bfloat16"))


def test_bf16_kv_greedy_agreement(bf16_kv_runner, hf_rounded, hf_model, tokenizer):
    """KV rounded to bf16 as it is stored (a relative 2^-9 per element, attention's sums in fp32):
    greedy picks move only near ties. The figures asserted are docs/cpu-kernels.md's."""
    assert bf16_kv_runner.kv.k[0].dtype == torch.bfloat16 and bf16_kv_runner.attn.dtype == torch.float32
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS]
    ours = _generate(bf16_kv_runner, prompts, list(range(len(prompts))), _Slots(bf16_kv_runner.config.kv_slots),
                     NEW_TOKENS)
    rounded = sum(o == _hf_greedy(hf_rounded, ids, NEW_TOKENS) for o, ids in zip(ours, prompts))
    fp32 = sum(o == _hf_greedy(hf_model, ids, NEW_TOKENS) for o, ids in zip(ours, prompts))
    print(f"bf16 weights and KV: {rounded} of {len(prompts)} identical to HF with the same rounded weights, "
          f"{fp32} to HF fp32, over {NEW_TOKENS} tokens")
    assert rounded >= 14 and fp32 >= 13, (rounded, fp32)  # measured on AVX2 (Zen 3): 15 and 14
