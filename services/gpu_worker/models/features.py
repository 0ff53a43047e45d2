"""What a checkpoint's config.json asks of the model, feature by feature.

Each model family declares the features it implements (``FEATURES`` on its class); the config
reader refuses the rest at start, naming the field that asks, so nothing is served wrong. A
feature at its default value (rope ``default``, no window that binds, ...) is not asked for.
"""

from __future__ import annotations

from dataclasses import dataclass

MOE_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts")
SHARED_EXPERTS = ("shared_expert_intermediate_size", "n_shared_experts")  # Qwen2-MoE's, DeepSeek's
SOFTCAPS = {"attn_logit_softcapping": "softcap:attention", "final_logit_softcapping": "softcap:final"}


class UnsupportedModel(ValueError):
    """A checkpoint the worker would serve wrong: refused at start, with the fields that ask."""


@dataclass(frozen=True)
class Ask:
    feature: str  # what a model must implement: "rope:yarn", "act:gelu", "moe", ...
    field: str  # the config field that asks for it
    value: object


def rope_params(raw: dict) -> dict:
    """The rope dict, new (``rope_parameters``) or legacy (``rope_scaling`` + ``rope_theta``) layout;
    where it holds one dict per layer type (Gemma 3), the ``full_attention`` layers'."""
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    return (rope["full_attention"] or {}) if isinstance(rope.get("full_attention"), dict) else rope


def layer_ropes(raw: dict) -> dict[str, dict]:
    """Layer type -> its rope dict where ``rope_parameters`` is laid out per layer type (Gemma 3 in
    transformers 5), else {"": the one rope dict}."""
    rope = raw.get("rope_parameters") or {}
    if any(isinstance(v, dict) for v in rope.values()):
        return {k: v or {} for k, v in rope.items() if isinstance(v, dict) or v is None}
    return {"": rope_params(raw)}


def rope_type(raw: dict) -> str:
    return _type(rope_params(raw))


def _type(rope: dict) -> str:
    return rope.get("rope_type", rope.get("type", "default"))


def partial_rotary_factor(raw: dict) -> float:
    """The share of each head that rotates (Phi-3 / Phi-4-mini: 0.75); the rest passes through."""
    return float(rope_params(raw).get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)))


def sliding_windows(raw: dict) -> tuple[int | None, ...]:
    """Each layer's attention window where it binds (shorter than max_position_embeddings), else
    None. Qwen2/3 turn windows on with ``use_sliding_window`` and keep the first
    ``max_window_layers`` layers global; ``layer_types`` (transformers 5) names them outright;
    Mistral's ``sliding_window`` holds on every layer."""
    layers = raw.get("num_hidden_layers", 0)
    window = raw.get("sliding_window")
    if not window or window >= raw.get("max_position_embeddings", 2048) or raw.get("use_sliding_window") is False:
        return (None,) * layers
    if raw.get("layer_types"):
        return tuple(window if t == "sliding_attention" else None for t in raw["layer_types"])
    if pattern := raw.get("sliding_window_pattern"):  # NOTE: Gemma 3's legacy layout: every pattern-th is global
        return tuple(window if (i + 1) % pattern else None for i in range(layers))
    first = raw.get("max_window_layers", 0) if "use_sliding_window" in raw else 0
    return tuple(window if i >= first else None for i in range(layers))


def asks(raw: dict) -> list[Ask]:
    """Every non-default feature ``raw`` (a config.json) asks for, plus its activation and rope type;
    a multimodal wrapper's are its text model's (``text_config``)."""
    out = _quantization(raw)
    if "text_config" in raw:
        return [Ask("text_config", "text_config", "a multimodal wrapper's text model"), *out, *asks(raw["text_config"])]
    act = "hidden_act" if raw.get("hidden_act") or not raw.get("hidden_activation") else "hidden_activation"
    out += [Ask(f"act:{_activation(raw)}", act, _activation(raw))]
    out += [Ask(f"rope:{_type(r)}", f"rope_parameters{'.' + k if k else ''}.rope_type", _type(r))
            for k, r in layer_ropes(raw).items()]
    out += [Ask("moe", f, raw[f]) for f in MOE_FIELDS if raw.get(f)]
    out += [Ask("moe:shared_experts", f, raw[f]) for f in SHARED_EXPERTS if raw.get(f)]
    if raw.get("use_bidirectional_attention"):
        out.append(Ask("bidirectional", "use_bidirectional_attention", True))
    if (factor := partial_rotary_factor(raw)) != 1.0:
        out.append(Ask("partial_rotary", "partial_rotary_factor", factor))
    out += [Ask(feature, f, raw[f]) for f, feature in SOFTCAPS.items() if raw.get(f)]
    if any(windows := sliding_windows(raw)):
        out.append(Ask("sliding_window", "sliding_window", min(w for w in windows if w)))
    return out


def refuse_unsupported(raw: dict, features: frozenset[str], where: str) -> None:
    """Raise UnsupportedModel naming every field of ``raw`` that asks for a feature not in ``features``."""
    missing = [a for a in asks(raw) if a.feature not in features]
    if missing:
        said = "; ".join(f"{a.field}={a.value!r} ({a.feature})" for a in missing)
        raise UnsupportedModel(f"{where}: not supported by this worker, refused rather than served wrong: {said}")


def _quantization(raw: dict) -> list[Ask]:
    if raw.get("quantization_config") or raw.get("compression_config"):
        field = "quantization_config" if raw.get("quantization_config") else "compression_config"
        return [Ask("quantization", field, (raw[field] or {}).get("quant_method", "?"))]
    return []


def _activation(raw: dict) -> str:
    return raw.get("hidden_act") or raw.get("hidden_activation") or "silu"
