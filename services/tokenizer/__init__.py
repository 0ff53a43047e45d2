"""Tokenizer service: chat templates, encode, incremental detokenize, stop strings."""
