"""Prompt encoding and validation with the real default tokenizer."""

from __future__ import annotations

import pytest

from libs.protocol.errors import ServiceError
from libs.protocol.messages import ChatMessage, EncodeRequest
from services.tokenizer.encoder import Encoder


def req(**kw) -> EncodeRequest:
    return EncodeRequest(rid="r1", gateway="gw-1", **kw)


def error_of(encoder: Encoder, request: EncodeRequest) -> ServiceError:
    with pytest.raises(ServiceError) as err:
        encoder.encode(request)
    return err.value


def test_limits_come_from_config(encoder):
    assert encoder.max_model_len == 8192 and encoder.vocab_size == 49152


def test_chat_messages_match_hf_chat_template(encoder, tokenizer):
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say hi in 日本語 👋"},
        {"role": "assistant", "content": "こんにちは"},
        {"role": "user", "content": "Again?"},
    ]
    for gen in (True, False):
        out = encoder.encode(req(
            messages=[ChatMessage(**m) for m in messages], add_generation_prompt=gen,
        ))
        expected = tokenizer.apply_chat_template(
            messages, add_generation_prompt=gen, tokenize=True, return_dict=False
        )
        assert out.input_ids == list(expected)
    assert tokenizer.decode(out.input_ids).endswith("<|im_start|>user\nAgain?<|im_end|>\n")


def test_text_encodes_like_hf_call(encoder, tokenizer):
    text = "Once upon a time, in a land far away"
    out = encoder.encode(req(text=text, max_new_tokens=16))
    assert out.input_ids == tokenizer(text).input_ids
    assert (out.max_new_tokens, out.max_model_len) == (16, 8192)


def test_input_ids_pass_through_and_budget_defaults_to_context(encoder):
    out = encoder.encode(req(input_ids=[1, 2, 3, 49151]))
    assert out.input_ids == [1, 2, 3, 49151] and out.max_new_tokens == 8192 - 4


@pytest.mark.parametrize("kwargs, fragment", [
    ({}, "exactly one"),
    ({"text": "a", "input_ids": [1]}, "exactly one"),
    ({"text": "a", "messages": [ChatMessage(role="user", content="a")]}, "exactly one"),
    ({"text": ""}, "empty"),
    ({"input_ids": []}, "empty"),
    ({"messages": []}, "messages must not be empty"),
    ({"messages": [ChatMessage(role="wizard", content="a")]}, "wizard"),
    ({"input_ids": [5, 49152]}, "[0, 49152)"),
    ({"input_ids": [-1]}, "[0, 49152)"),
    ({"text": "a", "max_new_tokens": -1}, "max_new_tokens"),
    ({"text": "a", "max_new_tokens": -5}, "max_new_tokens"),
    ({"text": "a", "stop": ["ok", ""]}, "stop"),
])
def test_invalid_requests_are_400(encoder, kwargs, fragment):
    err = error_of(encoder, req(**kwargs))
    assert (err.code, err.status) == ("invalid_request_error", 400)
    assert fragment in err.message


def test_bad_gateway_id_is_400(encoder):
    err = error_of(encoder, EncodeRequest(rid="r", gateway="gw.1", text="a"))
    assert err.status == 400 and "gateway" in err.message


def test_prompt_at_context_length_is_rejected(encoder):
    err = error_of(encoder, req(input_ids=[7] * 8192))
    assert (err.code, err.status) == ("context_length_exceeded", 400)
    assert err.message.startswith(
        "This model's maximum context length is 8192 tokens. However, you requested 8193 "
        "tokens (8192 in the messages, 1 in the completion)."
    )
    assert encoder.encode(req(input_ids=[7] * 8191)).max_new_tokens == 1


def test_prompt_plus_completion_over_context_is_rejected(encoder):
    err = error_of(encoder, req(input_ids=[7] * 8000, max_new_tokens=193))
    assert err.code == "context_length_exceeded"
    assert "8193 tokens (8000 in the messages, 193 in the completion)" in err.message
    assert encoder.encode(req(input_ids=[7] * 8000, max_new_tokens=192)).max_new_tokens == 192


def test_override_context_length(model_dir):
    small = Encoder.load(model_dir, max_model_len=16)
    assert small.encode(req(text="hello")).max_new_tokens == 16 - 1
    assert error_of(small, req(text="hello " * 20)).code == "context_length_exceeded"


def test_a_gemma3_tokenizer_without_a_template_gets_gemmas_turn_format(tmp_path, model_dir):
    """A GGUF's Gemma tokenizer carries no chat template: Gemma's turn format is supplied."""
    import json
    import shutil

    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(model_dir / name, tmp_path / name)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma3_text", "max_position_embeddings": 512,
                                                      "vocab_size": 49152}))
    encoder = Encoder.load(tmp_path)
    messages = [ChatMessage(role="system", content="Be brief."), ChatMessage(role="user", content="Hi"),
                ChatMessage(role="assistant", content="Hello"), ChatMessage(role="user", content="Bye")]
    ids = encoder.encode(req(messages=messages)).input_ids
    assert encoder.tokenizer.decode(ids).endswith(
        "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")
