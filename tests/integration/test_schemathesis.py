"""schemathesis fuzzes the gateway from its own OpenAPI document: no 5xx, ever.

Positive and negative bodies for every operation, against a real stack with API
keys and a small --max-tokens-cap (so valid bodies generate a few tokens only).
After the run the stack is healthy and serves a normal request.
"""

from __future__ import annotations

import os

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from libs.models import DEFAULT_MODEL
from radixmesh.launcher import LocalStack, ephemeral_stack_config
from services.gateway.openapi import openapi_document

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "SmolLM2-135M-Instruct"
KEY = "fuzz-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
EXAMPLES = int(os.environ.get("RADIXMESH_FUZZ_EXAMPLES", "40"))  # per operation (and phase)
_served: list[int] = []  # responses seen, by status (checked at the end)


@pytest.fixture(scope="module")
def fuzz_stack(tmp_path_factory):
    logs = tmp_path_factory.mktemp("fuzz-stack")
    keys = logs / "keys.txt"
    keys.write_text(f"{KEY} fuzzer\n")
    gateway = ["--api-keys-file", str(keys), "--max-tokens-cap", "4",
               "--max-prompt-tokens", "256", "--request-deadline", "30",
               "--max-body-bytes", str(256 * 1024)]
    config = ephemeral_stack_config(logs, workers=1, extra={"gateway": gateway})
    with LocalStack(config, progress=lambda msg: None) as running:
        yield running


# the document the stack's gateway serves (compared below); loaded eagerly:
# schemathesis' lazy fixture loader does not run under pytest 9
DOCUMENT = openapi_document(models=(MODEL, DEFAULT_MODEL), secured=True)
schema = schemathesis.openapi.from_dict(DOCUMENT)


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_no_server_errors(case, fuzz_stack):
    response = case.call(base_url=fuzz_stack.url, headers=AUTH, timeout=60)
    _served.append(response.status_code)
    case.validate_response(response, checks=[not_a_server_error])


def test_fuzzing_reached_the_model_and_left_the_stack_healthy(fuzz_stack):
    assert len(_served) >= 3 * EXAMPLES // 2, len(_served)
    assert _served.count(200) >= 10, sorted(set(_served))  # valid bodies reached the model
    assert all(s < 500 for s in _served)
    fuzz_stack.check_alive()
    with httpx.Client(base_url=fuzz_stack.url, timeout=60) as client:
        assert client.get("/openapi.json").json() == DOCUMENT  # what was fuzzed is what is served
        assert client.get("/health").status_code == 200
        resp = client.post("/v1/completions", headers=AUTH,
                           json={"model": MODEL, "prompt": "Hello", "max_tokens": 2})
        assert resp.status_code == 200, resp.text
