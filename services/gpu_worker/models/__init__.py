"""The model and its loading: the HF config (config.py), the checkpoint's weights and their
packed forms (weights.py), the Llama-family model (model.py), a decode step's layers in one
C++ call (layer_loop.py), the compiled step (compiled.py), ``--dtype``/``--kv-dtype`` (precision.py)."""
