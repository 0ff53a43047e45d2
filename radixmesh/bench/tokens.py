"""The real tokenizer, as the harness uses it: chat template, counting, prefix sharing."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence


class ChatTokenizer:
    """The model's HF tokenizer and chat template (the same ones the server applies)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    @classmethod
    def load(cls, model_dir: Path) -> "ChatTokenizer":
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(model_dir))

    def count(self, text: str) -> int:
        """Tokens of plain text (no special tokens)."""
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt(self, messages: list[dict[str, str]]) -> str:
        """The templated prompt text, ending with the assistant header."""
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                  tokenize=False)

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        return list(self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False))

    def text_ids(self, text: str) -> list[int]:
        """Ids of an already templated prompt (what the server's encoder computes)."""
        return list(self.tokenizer(text)["input_ids"])


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def trie_size(seqs: Sequence[Sequence[int]]) -> int:
    """Nodes of the token trie of ``seqs``: the tokens an unbounded prefix cache stores.

    NOTE: in lexicographic order each sequence adds exactly the tokens after its
    longest common prefix with its predecessor.
    """
    ordered = sorted(tuple(s) for s in seqs)
    total, prev = 0, ()
    for seq in ordered:
        total += len(seq) - common_prefix(prev, seq)
        prev = seq
    return total


def ideal_hit_rate(seqs: Sequence[Sequence[int]]) -> float:
    """Cached / prompt tokens if every shared prefix were computed once and kept."""
    total = sum(len(s) for s in seqs)
    return 0.0 if total == 0 else 1.0 - trie_size(seqs) / total
