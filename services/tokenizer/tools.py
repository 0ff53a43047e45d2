"""Tools in a chat prompt: the template's own format when it has one, else hermes'.

A template that reads ``tools`` gets them as transformers' ``apply_chat_template(tools=...)``
passes them (OpenAI's ``{"type": "function", "function": {...}}``), and messages keep
their ``tool_calls`` (arguments as objects, as HF templates expect) and ``tool_call_id``.
A template without tool support (the default model's) gets the hermes convention,
which the gateway parses back: the tools listed in the system message, calls as
``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` and results as
``<tool_response>`` in a user turn.
"""

from __future__ import annotations

import json

from libs.protocol.messages import ChatMessage, ToolCall, ToolSpec

HERMES_SYSTEM = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n"
    "</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


def supports_tools(template: str | None) -> bool:
    return bool(template) and "tools" in template


def tool_dicts(tools: list[ToolSpec]) -> list[dict]:
    return [{"type": "function", "function": {"name": t.name, "description": t.description,
                                              "parameters": json.loads(t.parameters)}}
            for t in tools]


def template_inputs(messages: list[ChatMessage], tools: list[ToolSpec],
                    template: str | None) -> tuple[list[dict], dict]:
    """(messages, extra apply_chat_template kwargs) for ``template``."""
    if supports_tools(template):
        extra = {"tools": tool_dicts(tools)} if tools else {}
        return [_native(m) for m in messages], extra
    needs_hermes = tools or any(m.tool_calls or m.role == "tool" for m in messages)
    if not needs_hermes:
        return [{"role": m.role, "content": m.content} for m in messages], {}
    out = [_hermes(m) for m in messages]
    if tools:
        listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tool_dicts(tools))
        system = HERMES_SYSTEM.format(tools=listed)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + system}
        else:
            out.insert(0, {"role": "system", "content": system})
    return out, {}


def _native(m: ChatMessage) -> dict:
    msg: dict = {"role": m.role, "content": m.content}
    if m.tool_calls:
        msg["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.name, "arguments": _arguments(c)}}
                             for c in m.tool_calls]
    if m.tool_call_id:
        msg["tool_call_id"] = m.tool_call_id
    return msg


def _hermes(m: ChatMessage) -> dict:
    if m.role == "tool":
        return {"role": "user", "content": f"<tool_response>\n{m.content}\n</tool_response>"}
    calls = [f'<tool_call>\n{json.dumps({"name": c.name, "arguments": _arguments(c)}, ensure_ascii=False)}'
             "\n</tool_call>" for c in m.tool_calls]
    content = "\n".join(([m.content] if m.content else []) + calls)
    return {"role": m.role, "content": content}


def _arguments(call: ToolCall) -> dict | str:
    try:
        return json.loads(call.arguments)
    except ValueError:
        return call.arguments
