"""Tool calling on chat completions: ``tools`` and ``tool_choice`` as vLLM takes them.

* ``none``: the tools are not offered (not in the prompt), the output is text.
* ``auto`` (the default with tools): the tools reach the chat template (the
  tokenizer's :mod:`services.tokenizer.tools`) and hermes-style calls in the output
  become ``message.tool_calls`` (:mod:`.tool_parser`).
* ``required`` / a named function: the output is constrained (the JSON-schema ->
  regex machinery of ``response_format``) to exactly one call,
  ``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>``, whose arguments
  match that function's ``parameters`` (any of the tools' for ``required``).
"""

from __future__ import annotations

import json

from libs.grammar.json_schema import SchemaError, schema_to_regex
from libs.protocol.messages import ToolCall, ToolSpec

from .errors import bad_request
from .request import GenerationRequest
from .schemas import ChatCompletionRequest, Message, ToolBody
from .structured import check_size

NO_ARGUMENTS = {"type": "object", "additionalProperties": False}
CALL_PREFIX, CALL_SUFFIX = r"<tool_call>\n", r"\n</tool_call>"


def apply_tools(req: GenerationRequest, body: ChatCompletionRequest) -> None:
    """Set ``req.tools`` / ``req.tool_mode`` (and the forced call's regex) from ``body``."""
    tools, choice = body.tools or [], body.tool_choice
    if choice is not None and choice != "none" and not tools:
        raise bad_request("tool_choice needs tools", "tool_choice")
    names = [t.function.name for t in tools]
    if len(set(names)) != len(names):
        raise bad_request("tools must have distinct function names", "tools")
    if not tools or choice == "none":
        return
    req.tools = [_spec(t) for t in tools]
    req.tool_mode = "auto"
    if choice is None or choice == "auto":
        return
    forced = tools if choice == "required" else [t for t in tools if t.function.name == choice.function.name]
    if not forced:
        raise bad_request(f"tool_choice names function {choice.function.name!r}, which is not "
                          "among the tools", "tool_choice.function.name")
    if req.params.regex:
        raise bad_request("a forced tool_choice and regex / response_format exclude each other",
                          "tool_choice")
    if req.params.ignore_eos:
        raise bad_request("a forced tool_choice and ignore_eos exclude each other: the call ends "
                          "the output", "tool_choice")
    req.params.regex = call_regex(forced, [names.index(t.function.name) for t in forced])
    req.tool_mode = "forced"


def call_regex(tools: list[ToolBody], positions: list[int]) -> str:
    """One call of any of ``tools`` (``positions``: their indexes in the request, for errors)."""
    calls = [{"type": "object", "required": ["name", "arguments"],
              "properties": {"name": {"const": t.function.name},
                             "arguments": _parameters(t)}} for t in tools]
    param = f"tools[{positions[0]}].function.parameters" if len(tools) == 1 else "tools"
    try:
        pattern = schema_to_regex(calls[0] if len(calls) == 1 else {"anyOf": calls})
    except SchemaError as exc:
        raise bad_request(f"tool parameters: {exc}", param) from None
    except RecursionError:
        raise bad_request("tool parameters: nested too deeply", param) from None
    pattern = CALL_PREFIX + pattern + CALL_SUFFIX
    check_size(pattern, param)
    return pattern


def _parameters(tool: ToolBody) -> dict:
    return tool.function.parameters or NO_ARGUMENTS


def _spec(tool: ToolBody) -> ToolSpec:
    fn = tool.function
    return ToolSpec(name=fn.name, description=fn.description or "",
                    parameters=json.dumps(fn.parameters or {"type": "object", "properties": {}}))


def message_tool_fields(msg: Message, index: int) -> dict:
    """ChatMessage fields of a message's tool_calls / tool_call_id (400 where misplaced)."""
    if msg.tool_calls and msg.role != "assistant":
        raise bad_request("only assistant messages carry tool_calls", f"messages[{index}].tool_calls")
    if msg.role == "tool" and not msg.tool_call_id:
        raise bad_request("a tool message needs tool_call_id", f"messages[{index}].tool_call_id")
    calls = [ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments)
             for c in msg.tool_calls or []]
    return {"tool_calls": calls, "tool_call_id": msg.tool_call_id or ""}
