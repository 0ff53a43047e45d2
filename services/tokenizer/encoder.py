"""Prompt encoding: chat template, validation, context-length budget (pure, no bus)."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from libs.protocol import errors
from libs.protocol.messages import EncodeRequest
from libs.protocol.subjects import check_token

from .tools import template_inputs

CHAT_ROLES = frozenset({"system", "user", "assistant", "tool"})


@dataclass(frozen=True)
class Encoded:
    input_ids: list[int]
    max_new_tokens: int
    max_model_len: int


class Encoder:
    """Encodes EncodeRequests with one HF tokenizer; raises ServiceError on bad input.

    Not thread-safe: give each thread its own :meth:`copy`.
    """

    def __init__(self, tokenizer: Any, max_model_len: int, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size

    @classmethod
    def load(cls, model_dir: Path, max_model_len: int | None = None) -> "Encoder":
        """Load the tokenizer of an HF model directory; limits come from config.json."""
        from transformers import AutoTokenizer

        config = json.loads((Path(model_dir) / "config.json").read_text())
        config = config.get("text_config", config)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        if not tokenizer.chat_template and str(config.get("model_type", "")).startswith("gemma3"):
            from libs.models import GEMMA_CHAT_TEMPLATE

            tokenizer.chat_template = GEMMA_CHAT_TEMPLATE  # NOTE: a GGUF's Gemma tokenizer carries none
        limit = max_model_len or config.get("max_position_embeddings")
        if not limit:
            raise ValueError(f"{model_dir}/config.json has no max_position_embeddings")
        vocab = int(config.get("vocab_size") or len(tokenizer))
        return cls(tokenizer, int(limit), vocab)

    def copy(self) -> "Encoder":
        return Encoder(copy.deepcopy(self.tokenizer), self.max_model_len, self.vocab_size)

    def encode(self, req: EncodeRequest) -> Encoded:
        """Validate ``req``, build its prompt ids and resolve max_new_tokens."""
        _check_request(req)
        if req.messages is not None:
            ids = self._chat(req)
        elif req.text is not None:
            ids = list(self.tokenizer(req.text)["input_ids"])
        else:
            ids = self._check_ids(req.input_ids or [])
        if not ids:
            raise errors.invalid_request("the prompt is empty")
        return Encoded(ids, self._budget(len(ids), req.max_new_tokens), self.max_model_len)

    def _chat(self, req: EncodeRequest) -> list[int]:
        messages = req.messages or []
        if not messages:
            raise errors.invalid_request("messages must not be empty")
        bad = sorted({m.role for m in messages} - CHAT_ROLES)
        if bad:
            raise errors.invalid_request(
                f"unsupported message role(s) {bad}; allowed: {sorted(CHAT_ROLES)}"
            )
        if not getattr(self.tokenizer, "chat_template", None):
            raise errors.invalid_request("this model has no chat template; send text instead")
        try:
            turns, extra = template_inputs(messages, req.tools, self.tokenizer.chat_template)
            ids = self.tokenizer.apply_chat_template(
                turns, add_generation_prompt=req.add_generation_prompt,
                tokenize=True, return_dict=False, **extra,
            )
        except Exception as exc:  # noqa: BLE001 - jinja raise_exception(), bad turn order
            raise errors.invalid_request(f"chat template rejected the messages: {exc}") from None
        return list(ids)

    def _check_ids(self, ids: list[int]) -> list[int]:
        if ids and (min(ids) < 0 or max(ids) >= self.vocab_size):
            raise errors.invalid_request(
                f"input_ids must be token ids in [0, {self.vocab_size})"
            )
        return ids

    def _budget(self, prompt_len: int, max_new_tokens: int | None) -> int:
        limit = self.max_model_len
        wanted = limit - prompt_len if max_new_tokens is None else max_new_tokens
        if prompt_len >= limit or prompt_len + wanted > limit:
            completion = max(wanted, 1)
            raise errors.context_length_exceeded(
                f"This model's maximum context length is {limit} tokens. However, you "
                f"requested {prompt_len + completion} tokens ({prompt_len} in the messages, "
                f"{completion} in the completion). Please reduce the length of the "
                "messages or completion."
            )
        return wanted


def _check_request(req: EncodeRequest) -> None:
    given = [req.text is not None, req.messages is not None, req.input_ids is not None]
    if sum(given) != 1:
        raise errors.invalid_request("give exactly one of text, messages or input_ids")
    if req.max_new_tokens is not None and req.max_new_tokens < 0:  # 0: prefill only
        raise errors.invalid_request(
            f"max_new_tokens must be at least 0, got {req.max_new_tokens}"
        )
    if not req.rid:
        raise errors.invalid_request("rid must not be empty")
    try:
        check_token(req.gateway)
    except ValueError:
        raise errors.invalid_request(f"gateway is not a valid instance id: {req.gateway!r}") from None
    if any(not s for s in req.stop):
        raise errors.invalid_request("stop strings must not be empty")
