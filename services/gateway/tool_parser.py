"""Tool calls in a model's output, hermes style: ``<tool_call>{"name": ..., "arguments":
{...}}</tool_call>``, parsed incrementally so streams can emit them as they close.

Text outside the tags is content. A tag whose body is not a JSON object with a
string ``name`` stays content, as the model wrote it (vLLM's hermes parser does the
same). Whitespace next to a call, and at the end, is not content.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # a JSON object, as text
    id: str = field(default_factory=lambda: "call_" + secrets.token_hex(12))

    def body(self) -> dict:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


Event = tuple[str, "str | ParsedCall"]  # ("content", text) or ("call", ParsedCall)


class ToolCallParser:
    def __init__(self) -> None:
        self._buf = ""
        self._in_call = False
        self._space = ""  # whitespace-only content held until more content comes
        self._after_call = False
        self.calls: list[ParsedCall] = []

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        out: list[Event] = []
        while True:
            if not self._in_call:
                at = self._buf.find(OPEN)
                if at < 0:
                    cut = len(self._buf) - _partial_suffix(self._buf, OPEN)
                    self._content(self._buf[:cut], out)
                    self._buf = self._buf[cut:]
                    return out
                self._content(self._buf[:at], out)
                self._buf, self._in_call = self._buf[at + len(OPEN):], True
            else:
                end = self._buf.find(CLOSE)
                if end < 0:
                    return out
                raw, self._buf, self._in_call = self._buf[:end], self._buf[end + len(CLOSE):], False
                self._call(raw, OPEN + raw + CLOSE, out)

    def finish(self) -> list[Event]:
        """The rest: an unclosed call that parses still counts, anything else is content."""
        out: list[Event] = []
        rest, self._buf = self._buf, ""
        if self._in_call:
            self._in_call = False
            self._call(rest, OPEN + rest, out)
        else:
            self._content(rest, out)
        return out

    def _call(self, raw: str, text: str, out: list[Event]) -> None:
        call = parse_call(raw)
        if call is None:
            self._content(text, out)
            return
        self._space, self._after_call = "", True
        self.calls.append(call)
        out.append(("call", call))

    def _content(self, text: str, out: list[Event]) -> None:
        text = self._space + text
        if not text or text.isspace():
            self._space = text
            return
        if self._after_call:  # NOTE: the line break after a call is not content
            text, self._after_call = text.lstrip(), False
        body = text.rstrip()
        self._space = text[len(body):]  # NOTE: held: dropped if a call or the end follows
        out.append(("content", body))


def parse_call(raw: str) -> ParsedCall | None:
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # NOTE: some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ParsedCall(obj["name"], json.dumps(args, ensure_ascii=False))


def parse_output(text: str) -> tuple[str | None, list[ParsedCall]]:
    """(content or None, calls) of a whole output."""
    parser = ToolCallParser()
    events = parser.feed(text) + parser.finish()
    content = "".join(e for kind, e in events if kind == "content").strip()
    return content or None, parser.calls


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
