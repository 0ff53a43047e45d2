"""The registry serves each architecture with its family's model, and refuses at start, naming
the field, every config feature and checkpoint tensor no part of the worker implements."""

from __future__ import annotations

import pytest

from services.gpu_worker import ModelRunner, RunnerConfig
from services.gpu_worker.models.features import UnsupportedModel
from services.gpu_worker.models.registry import MODELS, load_model, model_class

from .checkpoints import ARCHS, edit_config, write, write_config


def test_every_architecture_names_a_model_class():
    assert {model_class(a).__name__ for a in MODELS} == {"LlamaModel", "Qwen3Model", "Phi3Model", "Qwen3MoeModel",
                                                         "MixtralModel", "Gemma3Model"}
    assert {ARCHS[a][1] for a in ARCHS} <= set(MODELS)


LLAMA3_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": 1e4}

REFUSED = [  # (architecture, config overrides, words the error must hold)
    ("llama", dict(hidden_act="gelu"), "hidden_act='gelu'"),
    ("llama", dict(rope_parameters={"rope_type": "proportional", "rope_theta": 1e4}),
     "rope_parameters.rope_type='proportional'"),
    ("qwen3_moe", dict(shared_expert_intermediate_size=64), "shared_expert_intermediate_size=64 (moe:shared_experts)"),
    ("gemma3", dict(attn_logit_softcapping=50.0), "attn_logit_softcapping=50.0"),
    ("gemma3", dict(use_bidirectional_attention=True), "use_bidirectional_attention=True"),
    ("gemma3", dict(rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                                     "full_attention": {"rope_type": "longrope", "rope_theta": 1e6, "short_factor": [1.0] * 8,
                                                        "long_factor": [1.0] * 8, "original_max_position_embeddings": 64}}),
     "rope_parameters.full_attention.rope_type='longrope'"),
]


@pytest.mark.parametrize("arch,overrides,words", REFUSED, ids=[w.split("=")[0] for *_, w in REFUSED])
def test_config_features_no_part_implements_are_refused(tmp_path, arch, overrides, words):
    write_config(arch, tmp_path, **overrides)
    with pytest.raises(UnsupportedModel, match="refused rather than served wrong") as err:
        load_model(tmp_path)
    assert words in str(err.value)


EDITS = [  # (edit of config.json, words the error must hold)
    (lambda c: c.update(quantization_config={"quant_method": "fp8"}), "quantization_config='fp8'"),
    (lambda c: c.update(compression_config={"quant_method": "compressed-tensors"}), "compression_config"),
    (lambda c: c.update(num_local_experts=8), "num_local_experts=8"),
    (lambda c: c.update(num_experts=4), "num_experts=4"),
    (lambda c: c.update(text_config={"hidden_size": 96}), "text_config"),
    (lambda c: c.update(partial_rotary_factor=0.5), "partial_rotary_factor=0.5"),
    (lambda c: c.update(final_logit_softcapping=30.0), "final_logit_softcapping=30.0"),
]


@pytest.mark.parametrize("edit,words", EDITS, ids=[w.split("=")[0] for _, w in EDITS])
def test_edited_configs_are_refused_with_the_field(tmp_path, edit, words):
    write_config("llama", tmp_path)
    edit_config(tmp_path, edit)
    with pytest.raises(UnsupportedModel, match="refused rather than served wrong") as err:
        load_model(tmp_path)
    assert words in str(err.value)


@pytest.mark.parametrize("arch,reason", [("Gemma2ForCausalLM", "Gemma 2"), ("Mistral3ForConditionalGeneration", "multimodal"),
                                         ("GPT2LMHeadModel", "unknown")])
def test_architectures_not_served_are_refused_with_a_reason(tmp_path, arch, reason):
    write_config("llama", tmp_path)
    edit_config(tmp_path, lambda c: c.update(architectures=[arch]))
    with pytest.raises(UnsupportedModel, match=reason):
        load_model(tmp_path)


@pytest.mark.parametrize("overrides", [dict(sliding_window=256), dict(sliding_window=16, use_sliding_window=False),
                                       dict(sliding_window=16, use_sliding_window=True, max_window_layers=2)],
                         ids=["window-covers-context", "window-off", "window-layers-past-the-last"])
def test_windows_that_never_bind_are_served(tmp_path, overrides):
    write("qwen2", tmp_path, **overrides)
    assert not any(load_model(tmp_path).config.sliding_windows)


@pytest.mark.parametrize("arch,overrides", [("mistral", dict(sliding_window=32)), ("gemma3", dict(sliding_window=32)),
                                            ("qwen2", dict(use_sliding_window=True, sliding_window=32, max_window_layers=1))])
def test_a_window_that_binds_is_refused_on_backends_without_windows(tmp_path, arch, overrides):
    """cpu_v1 (the benchmarks' baseline) has no windows; every backend a worker picks has."""
    write(arch, tmp_path, **overrides)
    config = dict(model=str(tmp_path), kv_slots=256, max_requests=2, dtype="float32", attention_backend="cpu_v1")
    with pytest.raises(UnsupportedModel, match=r"sliding_window=32 binds .*--attention-backend torch"):
        ModelRunner(RunnerConfig(**config))
    runner = ModelRunner(RunnerConfig(**config, max_model_len=32))  # NOTE: a context the window covers
    assert not any(runner.attn.windows)
    for backend in ("cpu", "torch"):
        windowed = ModelRunner(RunnerConfig(**{**config, "attention_backend": backend}))
        assert windowed.attn.windows == {"mistral": (32, 32), "qwen2": (None, 32), "gemma3": (32, None)}[arch]
        assert not windowed.model.fast_decode_loop  # NOTE: the C++ decode loop has no window


def test_unused_checkpoint_tensors_are_refused(tmp_path):
    """A Qwen3 checkpoint relabelled Qwen2: its q/k norms would be dropped, answers wrong."""
    write("qwen3", tmp_path)
    edit_config(tmp_path, lambda c: c.update(architectures=["Qwen2ForCausalLM"]))
    with pytest.raises(UnsupportedModel, match=r"does not use.*q_norm"):
        load_model(tmp_path)


def test_a_long_context_model_sizes_its_tables_by_the_pool(tmp_path):
    write("llama", tmp_path, max_position_embeddings=131072, rope_parameters=LLAMA3_YARN)
    runner = ModelRunner(RunnerConfig(model=str(tmp_path), kv_slots=512, max_requests=4, dtype="float32"))
    assert runner.max_model_len == 512 and runner.table.shape == (4, 512)
    assert runner.model.rotary.cos.shape[0] == 512


def test_gemma3_with_compile_is_refused(tmp_path):
    """The compiled pieces are the Llama layer: Gemma 3 would be served wrong through them."""
    write("gemma3", tmp_path)
    with pytest.raises(UnsupportedModel, match="--compile.*Gemma3ForCausalLM"):
        ModelRunner(RunnerConfig(model=str(tmp_path), kv_slots=256, max_requests=2, dtype="float32", compile=True))


def test_legacy_gemma3_config_lays_out_its_layers(tmp_path):
    """transformers 4's layout (``sliding_window_pattern``, ``rope_local_base_freq``, ``rope_scaling``
    on the global layers) read as transformers 5 reads it."""
    from services.gpu_worker.models.gemma3 import GLOBAL, LOCAL, layer_rope, layer_types

    import transformers

    legacy = dict(num_hidden_layers=7, sliding_window_pattern=3, rope_theta=5e5, rope_local_base_freq=2e4,
                  rope_scaling={"rope_type": "linear", "factor": 8.0})
    hf = transformers.Gemma3TextConfig(**legacy)
    assert layer_types(legacy) == hf.layer_types == [LOCAL, LOCAL, GLOBAL, LOCAL, LOCAL, GLOBAL, LOCAL]
    for kind in (LOCAL, GLOBAL):
        theta, scaling = layer_rope(legacy, kind)
        assert theta == hf.rope_parameters[kind]["rope_theta"]
        assert (scaling or {}).get("factor") == hf.rope_parameters[kind].get("factor")
