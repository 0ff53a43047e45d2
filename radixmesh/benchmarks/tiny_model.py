"""A tiny random Llama with the default model's tokenizer and vocabulary, written offline.

Its forward (1 layer, hidden 64) costs the worker a fraction of a millisecond, so a stack
serving it shows what the rest of the mesh costs per step and per token: the scheduler,
tokenizer, gateway, cache index and broker. Its text is random tokens of the real
vocabulary, detokenized by the real tokenizer.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from libs.models import resolve_model

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16)
_WEIGHTS = (".safetensors", ".bin", ".pt", ".gguf")


def write_tiny_llama(dest: Path, seed: int = 0) -> Path:
    """Write the model into ``dest`` (config.json, safetensors, the default model's
    tokenizer files); returns ``dest``."""
    import torch
    import transformers

    base = resolve_model("default")
    dest.mkdir(parents=True, exist_ok=True)
    for f in base.iterdir():
        if f.is_file() and f.name != "config.json" and not f.name.endswith(_WEIGHTS) \
                and not f.name.startswith("."):
            shutil.copy2(f, dest / f.name)
    raw = json.loads((base / "config.json").read_text())
    raw.update(TINY)
    raw.pop("quantization_config", None)
    config = transformers.LlamaConfig(**{k: v for k, v in raw.items() if k not in ("architectures", "model_type")})
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config)
    model.eval().save_pretrained(dest)
    return dest
