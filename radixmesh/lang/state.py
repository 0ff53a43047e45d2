"""The state of a running program: its text (or chat messages), variables and calls.

``s += x`` does not wait: each state runs its appends in order on the runtime's
event loop, so the branches of a fork run concurrently. Reading (``s[name]``,
``s.text()``) waits for the appends before it. With ``concurrent=False`` every
append runs to completion at once, so a program's branches run one by one.

Text programs append plain text and call /v1/completions; chat programs are
made of role messages (``s += user("...")`` or ``with s.user(): s += "..."``)
and call /v1/chat/completions. A state is one or the other from its first
append.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from concurrent.futures import Future
from typing import Any, Awaitable, Callable, Coroutine, Iterator, Protocol

from .client import Call, Client, LangError, Usage, pick
from .ir import ROLES, Gen, Role, Select, as_parts


class Executor(Protocol):
    """What a state needs of its runtime (:class:`.runtime.Runtime`): the gateway client,
    and a loop that runs its requests (``submit`` returns a thread-safe future)."""

    client: Client

    def submit(self, coro: Coroutine) -> Future: ...


class ProgramState:
    def __init__(self, runtime: Executor, concurrent: bool = True) -> None:
        self._rt = runtime
        self._concurrent = concurrent
        self._chat: bool | None = None  # None: nothing appended yet
        self._text = ""
        self._messages: list[dict] = []
        self._open: dict | None = None  # the message a `with s.<role>():` block writes
        self._vars: dict[str, Any] = {}
        self._own: list[str] = []  # names this state set itself (join gathers them)
        self._tail: Future | None = None
        self._forks: list[ProgramState] = []
        self.calls: list[Call] = []  # this state's requests, in order

    # -- appending -----------------------------------------------------------

    def __iadd__(self, x) -> "ProgramState":
        parts = as_parts(x)
        self._enqueue(lambda: self._run_parts(parts))
        return self

    def system(self):
        return self._role_block("system")

    def user(self):
        return self._role_block("user")

    def assistant(self):
        return self._role_block("assistant")

    @contextlib.contextmanager
    def _role_block(self, role: str) -> Iterator[None]:
        self._enqueue(lambda: self._begin(role))
        yield
        self._enqueue(self._end)

    # -- fork / join -----------------------------------------------------------

    def fork(self, n: int) -> list["ProgramState"]:
        """``n`` states that continue from this one. First the server is made to hold
        the common prefix (a max_tokens 0 request); every branch then starts from it,
        so each one's prompt hits the prefix cache (see ``calls[i].usage.cached_tokens``)."""
        if n < 1:
            raise ValueError("fork: n must be >= 1")
        snapshot: dict = {}
        self._enqueue(lambda: self._hold(snapshot))
        branches = [ProgramState(self._rt, self._concurrent) for _ in range(n)]
        for b in branches:
            b._tail = self._tail
            b._enqueue(lambda b=b: b._start_from(snapshot))
        self._forks.extend(branches)
        return branches

    def join(self, branches: list["ProgramState"]) -> None:
        """Wait for ``branches`` and gather their variables: each name any branch set
        becomes the list of the values of the branches that set it, in branch order
        (a list whatever the number of branches: ``fork(1)`` gives a one-element
        list). The text stays as it was at the fork."""
        tails = [b._tail for b in branches]

        async def gather() -> None:
            for tail in tails:
                if tail is not None:
                    await asyncio.wrap_future(tail)
            names = list(dict.fromkeys(n for b in branches for n in b._own))
            for name in names:
                values = [b._vars[name] for b in branches if name in b._own]
                self._set(name, values)

        self._enqueue(gather)

    # -- reading -------------------------------------------------------------

    def sync(self) -> "ProgramState":
        """Wait for every append so far (and every fork's); raises the first failure."""
        if self._tail is not None:
            self._tail.result()
        for b in self._forks:
            b.sync()
        return self

    def __getitem__(self, name: str) -> Any:
        self.sync()
        return self._vars[name]

    def __contains__(self, name: str) -> bool:
        self.sync()
        return name in self._vars

    def variables(self) -> dict[str, Any]:
        self.sync()
        return dict(self._vars)

    def text(self) -> str:
        """The text so far (a chat program: its messages, one per line)."""
        self.sync()
        if self._chat:
            return "\n".join(f"{m['role']}: {m['content']}" for m in self._messages)
        return self._text

    def messages(self) -> list[dict]:
        self.sync()
        return copy.deepcopy(self._messages)

    @property
    def branches(self) -> list["ProgramState"]:
        return list(self._forks)

    def all_calls(self) -> list[Call]:
        """This state's calls and those of every branch forked from it (recursively)."""
        self.sync()
        return self.calls + [c for b in self._forks for c in b.all_calls()]

    def total_usage(self) -> Usage:
        calls = self.all_calls()
        return Usage(sum(c.usage.prompt_tokens for c in calls),
                     sum(c.usage.completion_tokens for c in calls),
                     sum(c.usage.cached_tokens for c in calls))

    # -- execution (on the runtime's loop) -------------------------------------

    def _enqueue(self, make: Callable[[], Awaitable[None]]) -> None:
        prev = self._tail

        async def op() -> None:
            if prev is not None:
                await asyncio.wrap_future(prev)  # NOTE: a failure fails everything after it
            await make()

        self._tail = self._rt.submit(op())
        if not self._concurrent:
            self._tail.result()

    async def _run_parts(self, parts: tuple) -> None:
        for part in parts:
            if isinstance(part, str):
                self._append(part)
            elif isinstance(part, Role):
                await self._begin(part.role)
                await self._run_parts(part.body.parts)
                await self._end()
            elif isinstance(part, Gen):
                await self._gen(part)
            elif isinstance(part, Select):
                await self._select(part)

    def _mode(self, chat: bool) -> None:
        if self._chat is None:
            self._chat = chat
        elif self._chat != chat:
            raise LangError("a state is either a text program or a chat program (roles)")

    def _append(self, text: str) -> None:
        if self._chat:
            if self._open is None:
                raise LangError("in a chat program, text goes inside a role")
            self._open["content"] += text
        else:
            self._mode(False)
            self._text += text

    async def _begin(self, role: str) -> None:
        if role not in ROLES:
            raise LangError(f"unknown role {role!r}")
        if self._open is not None:
            raise LangError("roles do not nest")
        self._mode(True)
        self._open = {"role": role, "content": ""}

    async def _end(self) -> None:
        if self._open is not None:
            self._messages.append(self._open)
            self._open = None

    async def _gen(self, g: Gen) -> None:
        params = dict(max_tokens=g.max_tokens, stop=g.stop, temperature=g.temperature, regex=g.regex)
        if g.json_schema is not None:
            params["response_format"] = {"type": "json_schema",
                                         "json_schema": {"name": g.name, "schema": g.json_schema}}
        if self._chat:
            if self._open is None or self._open["role"] != "assistant" or self._open["content"]:
                raise LangError("in a chat program, gen() is the whole of an assistant message")
            text, usage = await self._rt.client.chat(self._messages, **params)
        else:
            self._mode(False)
            text, usage = await self._rt.client.complete(self._text, **params)
        self.calls.append(Call("gen", usage))
        self._append(text)
        self._set(g.name, text)

    async def _select(self, s: Select) -> None:
        if self._chat:
            raise LangError("select() works in text programs (chat has no prompt logprobs)")
        self._mode(False)
        scores, usage = await self._rt.client.score(self._text, s.choices)
        self.calls.append(Call("select", usage))
        choice = s.choices[pick(scores, s.normalize)]
        self._append(choice)
        self._set(s.name, choice)

    async def _hold(self, snapshot: dict) -> None:
        if self._open is not None:
            raise LangError("fork inside a role block: close the message first")
        snapshot.update(chat=self._chat, text=self._text, messages=copy.deepcopy(self._messages),
                        vars=dict(self._vars))
        prefix = self._messages if self._chat else self._text
        if prefix:
            self.calls.append(Call("hold", await self._rt.client.hold(prefix)))

    async def _start_from(self, snapshot: dict) -> None:
        self._chat, self._text = snapshot["chat"], snapshot["text"]
        self._messages = copy.deepcopy(snapshot["messages"])
        self._vars = dict(snapshot["vars"])

    def _set(self, name: str, value: Any) -> None:
        self._vars[name] = value
        if name not in self._own:
            self._own.append(name)
