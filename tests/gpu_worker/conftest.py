"""The default model, loaded once: our ModelRunner and the HF reference."""

from __future__ import annotations

import pytest
import torch

from libs.models import resolve_model
from services.gpu_worker import ModelRunner, RunnerConfig


@pytest.fixture(scope="session")
def runner() -> ModelRunner:
    torch.set_num_threads(1)
    return ModelRunner(RunnerConfig(
        model=str(resolve_model()), kv_slots=2048, max_requests=16, dtype="float32"))  # NOTE: HF parity is fp32


@pytest.fixture(scope="session")
def hf_model(runner):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(runner.path, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def tokenizer(runner):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(runner.path)
