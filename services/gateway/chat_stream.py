"""One choice of an OpenAI stream: text deltas -> chunks; with tools, hermes calls in
the text become ``tool_calls`` deltas as each call closes (its arguments whole, in
one chunk), and the finish reason ``tool_calls`` when the output made any. With
logprobs, the first chunk of a delta carries its tokens' logprobs (an empty one
when the delta's text is held back: part of a character, or of a stop string)."""

from __future__ import annotations

from libs.protocol.messages import Logprobs

from .formats import OpenAIFormat
from .logprobs import LogprobStream
from .sse import sse_event
from .tool_parser import ToolCallParser


class ChoiceStream:
    def __init__(self, fmt: OpenAIFormat, index: int = 0, tools: bool = False,
                 logprobs: LogprobStream | None = None) -> None:
        self.fmt, self.index = fmt, index
        self.parser = ToolCallParser() if tools and fmt.chat else None
        self.logprobs = logprobs

    def events(self, text: str, finish_reason: str | None,
               logprobs: Logprobs | None = None) -> list[bytes]:
        """:meth:`chunks` as SSE events; a plain text delta (most of a stream) takes the
        short way, :meth:`OpenAIFormat.text_event`."""
        if self.parser is None and self.logprobs is None and finish_reason is None:
            return [self.fmt.text_event(text, self.index)] if text else []
        return [sse_event(chunk) for chunk in self.chunks(text, finish_reason, logprobs)]

    def chunks(self, text: str, finish_reason: str | None,
               logprobs: Logprobs | None = None) -> list[dict]:
        if self.parser is None:
            out = [self.fmt.chunk(text, index=self.index)] if text else []
        else:
            events = self.parser.feed(text) + (self.parser.finish() if finish_reason else [])
            out = [self._event(kind, value) for kind, value in events]
            if finish_reason == "stop" and self.parser.calls:
                finish_reason = "tool_calls"
        shown = self.logprobs.body(logprobs) if self.logprobs is not None else None
        if shown is not None:
            out = out or [self.fmt.chunk("", index=self.index)]
            out[0]["choices"][0]["logprobs"] = shown
        if finish_reason is not None:
            out.append(self.fmt.chunk(None, finish_reason, index=self.index))
        return out

    def _event(self, kind: str, value) -> dict:
        if kind == "content":
            return self.fmt.chunk(value, index=self.index)
        k = self.parser.calls.index(value)
        call = {"index": k, **value.body()}
        return self.fmt.chunk(None, index=self.index, delta={"tool_calls": [call]})
