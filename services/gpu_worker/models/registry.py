"""Architecture name (config.json's ``architectures[0]``) -> the model class that serves it,
imported on first use. Adding a model is one file beside this one plus one line here."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

from .features import UnsupportedModel

MODELS = {
    "LlamaForCausalLM": "llama:LlamaModel",
    "MistralForCausalLM": "llama:LlamaModel",
    "Qwen2ForCausalLM": "llama:LlamaModel",
    "Qwen3ForCausalLM": "qwen3:Qwen3Model",
    "Phi3ForCausalLM": "phi3:Phi3Model",
    "Qwen3MoeForCausalLM": "moe:Qwen3MoeModel",
    "MixtralForCausalLM": "moe:MixtralModel",
    "Gemma3ForCausalLM": "gemma3:Gemma3Model",
    "Gemma3ForConditionalGeneration": "gemma3:Gemma3Model",  # NOTE: its text model; images are not served
}

# NOTE: architectures people serve that are known and not implemented yet: a reason beats a bare "no"
NOT_YET = {
    "Gemma2ForCausalLM": "Gemma 2's layer (soft-capping, sandwich norms, GeGLU) is not implemented",
    "Mistral3ForConditionalGeneration": "a multimodal wrapper (text_config) is not implemented",
}


def architecture(raw: dict, where: str) -> str:
    """The checkpoint's architecture; UnsupportedModel unless this worker serves it."""
    arch = (raw.get("architectures") or ["?"])[0]
    if arch in MODELS:
        return arch
    why = NOT_YET.get(arch, "unknown to this worker")
    raise UnsupportedModel(f"{where}: architecture {arch} not supported: {why} (served: {', '.join(MODELS)})")


def model_class(arch: str) -> type:
    module, name = MODELS[arch].split(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), name)


def model_class_for(path: Path) -> type:
    """The class serving the checkpoint in ``path`` (refusals: :func:`architecture`)."""
    raw = json.loads((Path(path) / "config.json").read_text())
    return model_class(architecture(raw, str(path)))


def load_model(path: Path, **kwargs):
    """The model of the checkpoint in ``path``; ``kwargs`` go to its class (dtype, device, packing)."""
    return model_class_for(path)(Path(path), **kwargs)
