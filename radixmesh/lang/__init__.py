"""A small frontend language for LLM programs over the gateway's HTTP API.

Programs are ordinary Python functions that append text and generations to a
state; ``fork`` branches a state into parallel continuations that share its
prefix on the server (held with a ``max_tokens: 0`` request first, so every
branch hits the prefix cache)::

    from radixmesh import lang as rl

    @rl.function
    def handbook(s, document, topics):
        s += "Handbook:\\n" + document + "\\n\\n"
        branches = s.fork(len(topics))
        for b, topic in zip(branches, topics):
            b += f"Summarise what it says about {topic}:" + rl.gen("note", max_tokens=48, stop="\\n\\n")
        s.join(branches)                      # s["note"] == [note per topic]
        s += "Notes:\\n" + "\\n".join(s["note"]) + "\\nAdvice:" + rl.gen("advice", max_tokens=64)

    with rl.Runtime("http://localhost:8000") as rt:
        state = handbook.run(document=doc, topics=["leave", "expenses", "security"], runtime=rt)
        print(state["advice"], [b.calls[0].usage.cached_tokens for b in state.branches])
"""

from .client import Call, Client, LangError, Usage, choice_logprobs, pick
from .ir import assistant, gen, select, system, user
from .runtime import Program, Runtime, function, set_default_runtime
from .state import ProgramState

__all__ = [
    "Call", "Client", "LangError", "Program", "ProgramState", "Runtime", "Usage", "assistant",
    "choice_logprobs", "function", "gen", "pick", "select", "set_default_runtime", "system", "user",
]
