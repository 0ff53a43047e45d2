"""One choice of an OpenAI stream: text deltas -> chunks; with tools, hermes calls in
the text become ``tool_calls`` deltas as each call closes (its arguments whole, in
one chunk), and the finish reason ``tool_calls`` when the output made any."""

from __future__ import annotations

from .formats import OpenAIFormat
from .tool_parser import ToolCallParser


class ChoiceStream:
    def __init__(self, fmt: OpenAIFormat, index: int = 0, tools: bool = False) -> None:
        self.fmt, self.index = fmt, index
        self.parser = ToolCallParser() if tools and fmt.chat else None

    def chunks(self, text: str, finish_reason: str | None) -> list[dict]:
        if self.parser is None:
            out = [self.fmt.chunk(text, index=self.index)] if text else []
        else:
            events = self.parser.feed(text) + (self.parser.finish() if finish_reason else [])
            out = [self._event(kind, value) for kind, value in events]
            if finish_reason == "stop" and self.parser.calls:
                finish_reason = "tool_calls"
        if finish_reason is not None:
            out.append(self.fmt.chunk(None, finish_reason, index=self.index))
        return out

    def _event(self, kind: str, value) -> dict:
        if kind == "content":
            return self.fmt.chunk(value, index=self.index)
        k = self.parser.calls.index(value)
        call = {"index": k, **value.body()}
        return self.fmt.chunk(None, index=self.index, delta={"tool_calls": [call]})
