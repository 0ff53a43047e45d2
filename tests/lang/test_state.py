"""Programs against the scripted gateway (tests/lang/conftest.py): request bodies,
order, concurrency and variables."""

import pytest

from radixmesh import lang as rl
from radixmesh.lang.ir import Gen


@rl.function
def analyse(s, doc, topics):
    s += "Doc: " + doc + "\n"
    branches = s.fork(len(topics))
    for b, t in zip(branches, topics):
        b += f"About {t}:" + rl.gen("note", max_tokens=5, stop="\n")
    s.join(branches)
    s += "Notes: " + ",".join(s["note"]) + "\nSo:" + rl.gen("final", max_tokens=3)


def test_fork_holds_the_prefix_then_runs_branches_concurrently(runtime, gateway):
    s = analyse.run(doc="abc", topics=["x", "y", "z"], runtime=runtime)
    bodies = [b for _, b in gateway.bodies]
    prefix = "Doc: abc\n"
    assert bodies[0] == {"model": "m", "prompt": prefix, "max_tokens": 0}  # the hold
    branch = sorted(b["prompt"] for b in bodies[1:4])
    assert branch == [prefix + f"About {t}:" for t in "xyz"]
    assert all(b["max_tokens"] == 5 and b["stop"] == "\n" and b["temperature"] == 0.0
               for b in bodies[1:4])
    assert gateway.max_inflight == 3
    notes = [f"<{len(prefix + f'About {t}:')}>" for t in "xyz"]
    assert s["note"] == notes
    assert bodies[4]["prompt"] == prefix + "Notes: " + ",".join(notes) + "\nSo:"
    assert s.text().endswith("So:" + s["final"])
    assert [c.kind for c in s.calls] == ["hold", "gen"]
    assert all([c.kind for c in b.calls] == ["gen"] for b in s.branches)
    total = s.total_usage()
    assert total.prompt_tokens == sum(len(b.get("prompt", "")) for b in bodies)


def test_sequential_run_gives_the_same_result_one_request_at_a_time(runtime, gateway):
    a = analyse.run(doc="abc", topics=["x", "y"], runtime=runtime)
    gateway.max_inflight = 0
    b = analyse.run(doc="abc", topics=["x", "y"], runtime=runtime, concurrent=False)
    assert gateway.max_inflight == 1
    assert a.variables() == b.variables() and a.text() == b.text()


def test_select_sends_one_batched_scoring_request(runtime, gateway):
    @rl.function
    def pick(s):
        s += "Answer:"
        s += rl.select("a", [" a", " zzz", " aaaaaaaaaa"])
        s += rl.select("b", [" a", " zzz", " aaaaaaaaaa"], normalize=True)

    s = pick.run(runtime=runtime)
    # per character: -1, or -0.1 for a vowel; sum favours " a", the mean the long one
    assert s["a"] == " a" and s["b"] == " aaaaaaaaaa"
    assert s.text() == "Answer: a aaaaaaaaaa"
    path, body = gateway.bodies[0]
    assert path == "/v1/completions" and len(gateway.bodies) == 2
    assert body["prompt"] == ["Answer: a", "Answer: zzz", "Answer: aaaaaaaaaa"]
    assert body["echo"] is True and body["logprobs"] == 0 and body["max_tokens"] == 0


def test_chat_program_renders_messages_and_holds_them(runtime, gateway):
    @rl.function
    def chat(s):
        s += rl.system("Be brief.")
        with s.user():
            s += "Doc: abc"
        branches = s.fork(2)
        for i, b in enumerate(branches):
            b += rl.user(f"Question {i}?")
            b += rl.assistant(rl.gen("answer", max_tokens=4))
        s.join(branches)

    s = chat.run(runtime=runtime)
    shared = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Doc: abc"}]
    path, hold = gateway.bodies[0]
    assert path == "/v1/chat/completions" and hold["messages"] == shared and hold["max_tokens"] == 0
    asked = sorted(b["messages"][-1]["content"] for _, b in gateway.bodies[1:])
    assert asked == ["Question 0?", "Question 1?"]
    assert all(b["messages"][:2] == shared for _, b in gateway.bodies[1:])
    assert s["answer"] == ["reply3", "reply3"]
    assert s.branches[0].messages()[-1] == {"role": "assistant", "content": "reply3"}


@pytest.mark.parametrize("body, match", [
    (lambda s: (s.__iadd__(rl.user("x")), s.__iadd__(rl.select("a", ["b"]))), "text programs"),
    (lambda s: (s.__iadd__(rl.user("x")), s.__iadd__("loose")), "inside a role"),
    (lambda s: (s.__iadd__("t"), s.__iadd__(rl.user("x"))), "either"),
    (lambda s: s.__iadd__(rl.assistant("partial " + rl.gen("g"))), "whole of an assistant"),
    (lambda s: s.__iadd__("p" + Gen("g", max_tokens=-1)), "bad max_tokens"),
])
def test_misuse_and_server_errors_raise_langerror(runtime, body, match):
    prog = rl.function(lambda s: body(s))
    with pytest.raises(rl.LangError, match=match):
        prog.run(runtime=runtime)


def test_run_batch_keeps_input_order(runtime, gateway):
    @rl.function
    def one(s, word):
        s += word + rl.gen("out", max_tokens=2)

    states = one.run_batch([{"word": "a" * n} for n in range(1, 7)], runtime=runtime,
                           concurrency=3, progress=False)
    assert [st["out"] for st in states] == [f"<{n}>" for n in range(1, 7)]
    assert gateway.max_inflight == 3


def test_a_joined_capture_is_a_list_whatever_the_branch_count(runtime, gateway):
    # docs/programs.md's run_batch example with one topic: s["note"] must not be a string
    states = analyse.run_batch([{"doc": "abc", "topics": ["x"]}, {"doc": "de", "topics": ["x", "y"]}],
                               runtime=runtime, progress=False)
    one, two = (s["note"] for s in states)
    assert one == ["<17>"] and len(two) == 2 and all(isinstance(n, str) for n in two)
    assert states[0].text().startswith("Doc: abc\nNotes: <17>\nSo:")

    @rl.function
    def partly(s):
        branches = s.fork(3)
        branches[1] += "b" + rl.gen("only", max_tokens=2)
        s.join(branches)

    assert partly.run(runtime=runtime)["only"] == ["<1>"]  # set by one branch of three
