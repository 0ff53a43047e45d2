"""From logits to tokens: seeded sampling and min_p (sampler.py), logit_bias, min_tokens and
the penalties (penalties.py over seen_tokens.py), regex constraints (constraints.py, compiled
ahead by regex_compiler.py)."""
