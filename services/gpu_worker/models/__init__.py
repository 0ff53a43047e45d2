"""The models and their loading: the registry (registry.py: architecture -> model class, lazy),
one file per family (llama.py: Llama, Mistral, Qwen2; qwen3.py; phi3.py; moe.py: Qwen3-MoE,
Mixtral), the layers they share (layers.py: rope types, per-head norms; moe_layer.py: router and
experts), what a config asks and the refusals (features.py), the
HF config (config.py), the checkpoint's weights and their packed forms (weights.py), a decode
step's layers in one C++ call for the models that opt in (layer_loop.py), the compiled step
(compiled.py), ``--dtype``/``--kv-dtype`` (precision.py)."""
