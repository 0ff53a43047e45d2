"""Every served architecture (and every rope type) token-identical to HF greedy in fp32 on a tiny
random checkpoint, through ModelRunner: cold, from the prefix cache, in prefill chunks mixed with
decode steps, as a concurrent batch; on the C++ and the torch attention backends (sliding windows
that bind included: prompts and outputs run past the 16-token window)."""

from __future__ import annotations

import pytest
import torch

from services.gpu_worker import ModelRunner, RunnerConfig

from .checkpoints import write, write_gemma3_wrapper
from .greedy import Slots, generate, hf_greedy
from .test_rope import ROPES

N = 12
CASES = {  # name -> (architecture, config overrides)
    "llama": ("llama", {}),
    "qwen2": ("qwen2", {}),
    "mistral": ("mistral", {}),
    "qwen3": ("qwen3", {}),
    "phi3": ("phi3", {}),  # longrope, long factors (short ones: test_phi3.py)
    "phi4-mini": ("phi4-mini", {}),  # partial rotary and longrope
    "phi4": ("phi4", {}),
    "phi3-window": ("phi4", {"sliding_window": 16}),  # Phi-3-mini-4k's window (2047 of 4096), scaled down
    "qwen3_moe": ("qwen3_moe", {}),
    "qwen3_moe-dense-layer": ("qwen3_moe", {"norm_topk_prob": False, "mlp_only_layers": [0]}),
    "mixtral": ("mixtral", {}),
    "mistral-window": ("mistral", {"sliding_window": 16}),
    "qwen2-window": ("qwen2", {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1}),
    "gemma3": ("gemma3", {}),
    # NOTE: a local layer's 16-token window and rope base beside a global layer's linear-scaled rope; soft-capped logits
    "gemma3-window": ("gemma3", {"sliding_window": 16, "final_logit_softcapping": 3.0, "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}}}),
    **{f"llama-rope-{k}": ("llama", {"rope_parameters": {**v, "rope_theta": 1e4}})
       for k, v in ROPES.items() if k != "default"},
}


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(3, 300, (n,), generator=gen).tolist() for n in (29, 7, 18)]


RUNS = [(name, backend) for name in CASES for backend in ("cpu", "torch")]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return {}


@pytest.fixture(params=RUNS, ids=[f"{n}-{b}" for n, b in RUNS])
def case(request, checkpoints, tmp_path_factory):
    name, backend = request.param
    if name not in checkpoints:
        checkpoints[name] = _checkpoint(name, tmp_path_factory)
    return (*checkpoints[name], backend)


def _checkpoint(name, tmp_path_factory):
    """(checkpoint dir, HF's greedy outputs of _prompts()): the first seed whose greedy run has no
    near-tie (top two logits within 1e-4 of the largest: 100x fp32's disagreement), so a
    mismatch is a bug, not rounding."""
    arch, overrides = CASES[name]
    path = tmp_path_factory.mktemp(name)
    for seed in range(5):
        hf = write(arch, path, seed=seed, **overrides)
        refs = [hf_greedy(hf, p, N) for p in _prompts()]
        if min(gap for _, gap in refs) > 1e-4:
            return path, [tokens for tokens, _ in refs]
    raise AssertionError(f"{name}: every seed has a near-tie")


def test_greedy_matches_hf_cold_chunked_and_from_the_prefix_cache(case):
    path, refs, backend = case
    runner = ModelRunner(RunnerConfig(model=str(path), kv_slots=1024, max_requests=4, dtype="float32",
                                      attention_backend=backend))
    slots, prompts = Slots(1024), _prompts()
    cold, held = generate(runner, prompts, N, slots)
    assert cold == refs
    chunked, _ = generate(runner, prompts, N, slots, chunk=8)  # NOTE: prefill chunks beside decode tokens
    assert chunked == refs
    cached = [h[: len(p) - 3] for h, p in zip(held, prompts)]  # the prompts' KV but the last 3 tokens
    warm, _ = generate(runner, prompts, N, slots, cached=cached)
    assert warm == refs


def test_gemma3_multimodal_wrapper_serves_its_text_model(tmp_path):
    """Gemma3ForConditionalGeneration: text_config, the text weights under its language_model
    prefix, the vision tower's left unread; greedy identical to the HF wrapper's on text."""
    hf = write_gemma3_wrapper(tmp_path)
    refs = [hf_greedy(hf, p, N) for p in _prompts()]
    assert min(gap for _, gap in refs) > 1e-4
    runner = ModelRunner(RunnerConfig(model=str(tmp_path), kv_slots=1024, max_requests=4, dtype="float32"))
    assert runner.model.config.architecture == "Gemma3ForConditionalGeneration"
    assert generate(runner, _prompts(), N, Slots(1024))[0] == [tokens for tokens, _ in refs]
