"""Regex-constrained generation through the API, on the real stack and model."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from radixmesh import lang as rl

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DATE = r"\d{4}-\d{2}-\d{2}"
NAME = r"[A-Z][a-z]{1,12} [A-Z][a-z]{1,12}"


@pytest.fixture(scope="module")
def client(stack):
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key="unused", timeout=300)


def _generate(stack, text: str, **sampling) -> dict:
    resp = httpx.post(f"{stack.url}/generate", timeout=300,
                      json={"text": text, "sampling_params": {"max_new_tokens": 24, **sampling}})
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_chat_output_matches_the_pattern_and_ends_there(client):
    out = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "When did the war end? Give a date."}],
        max_tokens=24, temperature=0, extra_body={"regex": DATE})
    choice = out.choices[0]
    assert re.fullmatch(DATE, choice.message.content), choice.message.content
    assert choice.finish_reason == "stop" and out.usage.completion_tokens <= 11


def test_sampled_outputs_all_match_and_a_stream_too(stack, client):
    answers = {_generate(stack, "Is the sky blue? Answer:", regex=" ?(yes|no|maybe)",
                         temperature=1.0, seed=seed)["text"] for seed in range(6)}
    assert all(re.fullmatch(" ?(yes|no|maybe)", a) for a in answers), answers
    stream = client.completions.create(model="default", prompt="The author of the book is",
                                       max_tokens=16, temperature=0, stream=True,
                                       extra_body={"regex": " " + NAME})
    text = "".join(c.choices[0].text for c in stream)
    assert re.fullmatch(" " + NAME, text), text


def test_constrained_and_free_requests_share_batches_without_mixing(stack):
    prompts = [f"Item {i}: the price of the {w} is" for i, w in enumerate(["apple", "car", "house", "pen"])]
    free_alone = [_generate(stack, p, temperature=0)["text"] for p in prompts]
    jobs = [(p, {}) for p in prompts] + [(p, {"regex": r" \$[0-9]{1,4}\.[0-9]{2}"}) for p in prompts]
    with ThreadPoolExecutor(len(jobs)) as pool:
        outs = list(pool.map(lambda j: _generate(stack, j[0], temperature=0, **j[1])["text"], jobs))
    assert outs[:4] == free_alone
    assert all(re.fullmatch(r" \$[0-9]{1,4}\.[0-9]{2}", o) for o in outs[4:]), outs[4:]


@pytest.mark.parametrize("pattern, contains", [
    ("(unclosed", "regex"), ("a(?=b)", "regex"), ("(a|b)*a(a|b){24}", "states"),
])
def test_bad_patterns_are_400_and_the_server_goes_on(stack, pattern, contains):
    resp = httpx.post(f"{stack.url}/generate", timeout=60,
                      json={"text": "x", "sampling_params": {"max_new_tokens": 4, "regex": pattern}})
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["type"] == "invalid_request_error" and contains in err["message"]
    assert _generate(stack, "Hello", temperature=0, max_new_tokens=2)["meta_info"]["completion_tokens"] == 2


@rl.function
def profile(s, person):
    s += f"Here is a short profile of {person}.\nBorn (YYYY-MM-DD):"
    s += rl.gen("born", max_tokens=16, regex=" " + DATE)
    s += "\nAlive (yes or no):" + rl.gen("alive", max_tokens=4, regex=" (yes|no)")
    s += "\nAs JSON:" + rl.gen("card", max_tokens=48, json_schema={
        "type": "object", "required": ["name", "born"],
        "properties": {"name": {"type": "string", "maxLength": 30}, "born": {"type": "string", "format": "date"}}})


def test_a_program_fills_typed_fields(stack):
    with rl.Runtime(stack.url) as rt:
        state = profile.run(person="Ada Lovelace", runtime=rt)
    assert re.fullmatch(" " + DATE, state["born"]) and state["alive"] in (" yes", " no")
    card = json.loads(state["card"])
    assert set(card) == {"name", "born"} and re.fullmatch(DATE, card["born"])


def test_json_schema_response_format_gives_parseable_json(client):
    schema = {"type": "object", "required": ["name", "age", "city"], "properties": {
        "name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"},
        "city": {"type": "string", "enum": ["Paris", "London", "Rome"]}}}
    out = client.chat.completions.create(
        model="default", temperature=0, max_tokens=64,
        messages=[{"role": "user", "content": "Describe a person as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
    person = json.loads(out.choices[0].message.content)
    assert set(person) == {"name", "age", "city"} and isinstance(person["age"], int)
    assert person["city"] in ("Paris", "London", "Rome") and out.choices[0].finish_reason == "stop"
    anything = client.chat.completions.create(
        model="default", temperature=0, max_tokens=96, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": "JSON for a book please"}])
    assert anything.choices[0].finish_reason == "stop"  # (this prompt's object ends in 50 tokens)
    assert isinstance(json.loads(anything.choices[0].message.content), dict)


def test_generate_with_sglangs_json_schema(stack):
    schema = {"type": "object", "required": ["answer"], "properties": {"answer": {"type": "boolean"}}}
    out = _generate(stack, "Is Paris in France? Reply in JSON.", temperature=0,
                    json_schema=json.dumps(schema))
    assert isinstance(json.loads(out["text"])["answer"], bool)
    assert out["meta_info"]["finish_reason"] == {"type": "stop"}
