"""Validated request bodies -> :class:`GenerationRequest` (semantic checks here)."""

from __future__ import annotations

from libs.protocol.messages import ChatMessage

from .controls import check_controls
from .errors import ApiError, bad_request, not_supported
from .pipeline import GenerationRequest
from .sampling import sampling_params
from .schemas import ChatCompletionRequest, CompletionRequest, GenerateRequest, Message, OpenAIRequestBase
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
        req.params.return_logprob = req.show_logprobs = True
        req.params.top_logprobs_num = body.top_logprobs or 0
    if body.max_completion_tokens is not None:
        req.max_new_tokens = body.max_completion_tokens
    apply_tools(req, body)
    check_controls(req)
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
        req.params.return_logprob = True
        req.params.logprob_start_len = 0 if body.echo else -1
        req.params.top_logprobs_num = body.logprobs or 0
        req.show_logprobs = body.logprobs is not None
    check_controls(req)
    return req


def generate_request(body: GenerateRequest) -> GenerationRequest:
    if (body.text is None) == (body.input_ids is None):
        raise bad_request("exactly one of text or input_ids is required", "text")
    if body.text == "":
        raise bad_request("text must not be empty", "text")
    sp = body.sampling_params
    if body.return_logprob and body.stream:
        raise not_supported("return_logprob", " with stream")
    # NOTE: the logprob fields sit beside sampling_params (SGLang's layout)
    params = sampling_params((sp, "sampling_params."), (body, ""))
    params.regex = output_regex(sp.regex, native_format(sp.json_schema), sp.ignore_eos, "sampling_params.")
    req = GenerationRequest(
        text=body.text, input_ids=body.input_ids, add_generation_prompt=False,
        max_new_tokens=sp.max_new_tokens, params=params, cache_salt=body.cache_salt or "",
        show_logprobs=body.return_logprob,
    )
    check_controls(req, "sampling_params.", "min_new_tokens")
    return req


def _sampling(body: OpenAIRequestBase) -> GenerationRequest:
    if body.stream_options is not None and not body.stream:
        raise bad_request("stream_options is only allowed when stream is true", "stream_options")
    params = sampling_params((body, ""))
    params.regex = output_regex(body.regex, body.response_format, body.ignore_eos)
    return GenerationRequest(max_new_tokens=body.max_tokens, params=params, cache_salt=body.cache_salt or "")


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
