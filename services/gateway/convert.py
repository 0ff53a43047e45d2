"""Validated request bodies -> :class:`GenerationRequest` (semantic checks here)."""

from __future__ import annotations

from libs.protocol.messages import ChatMessage

from .controls import apply_controls
from .errors import ApiError, bad_request, not_supported
from .pipeline import GenerationRequest
from .schemas import (
    ChatCompletionRequest, CompletionRequest, GenerateRequest, Message, SamplingParamsBody,
    OpenAIRequestBase,
)
from .structured import native_format, output_regex
from .tools import apply_tools, message_tool_fields


def check_model(model: str, accepted: frozenset[str]) -> None:
    if model not in accepted:
        raise ApiError(404, f"The model `{model}` does not exist.", "model", "model_not_found")


MAX_BATCH_PROMPTS = 64  # prompts of one /v1/completions request


def chat_request(body: ChatCompletionRequest) -> GenerationRequest:
    if body.top_logprobs and not body.logprobs:
        raise bad_request("top_logprobs requires logprobs to be true", "top_logprobs")
    if body.max_tokens is not None and body.max_completion_tokens is not None \
            and body.max_tokens != body.max_completion_tokens:
        raise bad_request("max_tokens and max_completion_tokens differ", "max_completion_tokens")
    req = _sampling(body)
    req.messages = [_chat_message(m, i) for i, m in enumerate(body.messages)]
    if body.logprobs:  # of the output tokens only
        req.return_logprob = req.show_logprobs = True
        req.top_logprobs_num = body.top_logprobs or 0
    if body.max_completion_tokens is not None:
        req.max_new_tokens = body.max_completion_tokens
    apply_tools(req, body)
    _controls(req, body)
    return req


def completion_request(body: CompletionRequest) -> GenerationRequest:
    """The request of a one-prompt body (a batch of several is refused here)."""
    reqs = completion_requests(body)
    if len(reqs) != 1:
        raise bad_request("only one prompt per request is supported here", "prompt")
    return reqs[0]


def completion_requests(body: CompletionRequest) -> list[GenerationRequest]:
    """One request per prompt: a string, a list of token ids, or a list of strings
    (a batch, answered with one choice per prompt in order).

    ``logprobs: k`` returns the output tokens' logprobs with the k likeliest tokens
    each; with ``echo`` the prompt comes first in the text and its tokens'
    logprobs too (the first is null). ``max_tokens: 0`` only prefills the prompt
    (it stays in the prefix cache): with echo + logprobs, that scores a text.
    """
    if body.suffix:
        raise not_supported("suffix")
    if body.stream and body.echo:
        raise not_supported("echo", " with stream")
    prompt = body.prompt
    if isinstance(prompt, str) or all(isinstance(p, int) for p in prompt):
        prompts = [prompt]
    elif all(isinstance(p, str) for p in prompt):
        prompts = list(prompt)
    else:
        raise bad_request("prompt must be a string, a list of strings or a list of token ids",
                          "prompt")
    if len(prompts) > 1 and body.stream:
        raise bad_request("several prompts with stream are not supported", "prompt")
    if len(prompts) > MAX_BATCH_PROMPTS:
        raise bad_request(f"at most {MAX_BATCH_PROMPTS} prompts per request", "prompt")
    return [_completion(body, p) for p in prompts]


def _completion(body: CompletionRequest, prompt) -> GenerationRequest:
    req = _sampling(body)
    req.max_new_tokens = 16 if body.max_tokens is None else body.max_tokens  # OpenAI's default
    if isinstance(prompt, str):
        if prompt == "":
            raise bad_request("prompt must not be empty", "prompt")
        req.text = prompt
    else:
        req.input_ids = list(prompt)
    req.echo = body.echo
    if body.logprobs is not None or (body.echo and req.input_ids is not None):
        # NOTE: echoing token ids needs their text: the prompt's logprob pass brings it
        req.return_logprob = True
        req.logprob_start_len = 0 if body.echo else -1
        req.top_logprobs_num = body.logprobs or 0
        req.show_logprobs = body.logprobs is not None
    _controls(req, body)
    return req


def generate_request(body: GenerateRequest) -> GenerationRequest:
    if (body.text is None) == (body.input_ids is None):
        raise bad_request("exactly one of text or input_ids is required", "text")
    if body.text == "":
        raise bad_request("text must not be empty", "text")
    sp: SamplingParamsBody = body.sampling_params
    if body.return_logprob and body.stream:
        raise not_supported("return_logprob", " with stream")
    req = GenerationRequest(
        text=body.text, input_ids=body.input_ids, add_generation_prompt=False,
        max_new_tokens=sp.max_new_tokens, temperature=sp.temperature, top_p=sp.top_p,
        top_k=_top_k(sp.top_k, "sampling_params.top_k"), seed=sp.seed,
        stop=_stop(sp.stop), stop_token_ids=sp.stop_token_ids or [],
        ignore_eos=sp.ignore_eos, skip_special_tokens=sp.skip_special_tokens,
        cache_salt=body.cache_salt or "", return_logprob=body.return_logprob,
        logprob_start_len=body.logprob_start_len, top_logprobs_num=body.top_logprobs_num,
        show_logprobs=body.return_logprob,
        regex=output_regex(sp.regex, native_format(sp.json_schema), sp.ignore_eos, "sampling_params."),
    )
    apply_controls(req, presence=sp.presence_penalty, frequency=sp.frequency_penalty,
                   repetition=sp.repetition_penalty, min_p=sp.min_p, min_tokens=sp.min_new_tokens,
                   logit_bias=sp.logit_bias, prefix="sampling_params.", min_tokens_name="min_new_tokens")
    return req


def _sampling(body: OpenAIRequestBase) -> GenerationRequest:
    if body.stream_options is not None and not body.stream:
        raise bad_request("stream_options is only allowed when stream is true", "stream_options")
    return GenerationRequest(
        max_new_tokens=body.max_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=_top_k(body.top_k, "top_k"), seed=body.seed, stop=_stop(body.stop),
        stop_token_ids=body.stop_token_ids or [], ignore_eos=body.ignore_eos,
        skip_special_tokens=body.skip_special_tokens, cache_salt=body.cache_salt or "",
        regex=output_regex(body.regex, body.response_format, body.ignore_eos),
    )


def _controls(req: GenerationRequest, body: OpenAIRequestBase) -> None:
    apply_controls(req, presence=body.presence_penalty, frequency=body.frequency_penalty,
                   repetition=body.repetition_penalty, min_p=body.min_p, min_tokens=body.min_tokens,
                   logit_bias=body.logit_bias)


def _top_k(top_k: int | None, param: str) -> int:
    if top_k is None or top_k in (0, -1):
        return -1
    if top_k < 1:
        raise bad_request(f"{param} must be -1 (disabled) or >= 1", param)
    return top_k


def _stop(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if any(s == "" for s in stops):
        raise bad_request("stop strings must not be empty", "stop")
    return stops


def _chat_message(msg: Message, index: int) -> ChatMessage:
    role = "system" if msg.role == "developer" else msg.role
    content = msg.content
    if content is None:
        if msg.role != "assistant":
            raise bad_request(f"messages[{index}].content is required", f"messages[{index}].content")
        content = ""
    elif not isinstance(content, str):
        parts = []
        for part in content:
            if part.type != "text" or part.text is None:
                raise not_supported(f"messages[{index}].content", f" of type {part.type!r}")
            parts.append(part.text)
        content = "".join(parts)
    return ChatMessage(role=role, content=content, **message_tool_fields(msg, index))
