"""The model's shape, read from an HF directory's config.json (+ generation_config.json).

Reading refuses an architecture the registry does not serve; what a served architecture's
model implements of the config is checked by the model (features.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .features import rope_params, rope_type, sliding_windows
from .registry import MODELS, architecture

SUPPORTED_ARCHITECTURES = tuple(MODELS)


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]
    sliding_windows: tuple[int | None, ...] = ()  # per layer, where a window binds (features.py)
    raw: dict = field(default_factory=dict, compare=False, repr=False)  # config.json as read

    @classmethod
    def from_dir(cls, path: Path) -> "ModelConfig":
        raw = json.loads((path / "config.json").read_text())
        arch = architecture(raw, str(path))
        # NOTE: a multimodal wrapper serves its text model (its own fields where the text model's lack them)
        cfg = {**raw, **raw["text_config"]} if isinstance(raw.get("text_config"), dict) else raw
        heads = cfg["num_attention_heads"]
        rope = rope_params(cfg)
        return cls(
            architecture=arch,
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            vocab_size=cfg["vocab_size"],
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
            rope_scaling=rope if rope_type(cfg) != "default" else None,
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            eos_token_ids=_eos_ids(path, raw),
            sliding_windows=sliding_windows(cfg),
            raw=raw,
        )


def _eos_ids(path: Path, cfg: dict) -> tuple[int, ...]:
    """Union of config.json's and generation_config.json's ``eos_token_id`` (int or list)."""
    found: set[int] = set()
    sources = [cfg, cfg.get("text_config") or {}]
    gen = path / "generation_config.json"
    if gen.is_file():
        sources.append(json.loads(gen.read_text()))
    for source in sources:
        value = source.get("eos_token_id")
        if isinstance(value, int):
            found.add(value)
        elif isinstance(value, list):
            found.update(int(v) for v in value)
    return tuple(sorted(found))
