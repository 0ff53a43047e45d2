"""The model files a service loads: a local HF directory, or the default model prepared once
(or another shipped one: shipped.py) into the cache folder (``python -m libs.models [model]`` prepares it and prints the path)."""

from .resolve import (
    DEFAULT_MODEL, DEFAULT_MODEL_NAME, ModelNotFoundError, cache_dir, default_model_dir, model_path,
    resolve_model, served_name, shipped_dir,
)
from .shipped import GEMMA_CHAT_TEMPLATE, SHIPPED

__all__ = [
    "DEFAULT_MODEL", "DEFAULT_MODEL_NAME", "ModelNotFoundError", "cache_dir", "default_model_dir",
    "model_path", "resolve_model", "served_name", "shipped_dir", "GEMMA_CHAT_TEMPLATE", "SHIPPED",
]
