"""`radixmesh trace last` right after a request: the newest request's spans may still
be on their way (services export in batches), so it waits out the stack's delay."""

from __future__ import annotations

import json
import os
import threading
import time

from radixmesh.trace import SPANS_FILE, export_delay, find_trace, newest_spans


def _span(trace_id: str, rid: str, start_ns: int) -> dict:
    return {"trace_id": trace_id, "span_id": trace_id[:16], "parent_id": "", "name": "gateway.request",
            "service": "radixmesh-gateway", "instance": "", "kind": "internal", "start_ns": start_ns,
            "end_ns": start_ns + 1000, "status": "ok", "attributes": {"radixmesh.rid": rid}, "events": []}


def _append(path, span: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(span) + "\n")


def test_last_waits_for_the_request_whose_spans_are_still_on_their_way(tmp_path):
    spans = tmp_path / SPANS_FILE
    _append(spans, _span("a" * 32, "older", 1))
    state = {"pid": os.getpid(), "spans": True, "span_export_delay_s": 0.3}
    (tmp_path / "stack.json").write_text(json.dumps(state))
    assert export_delay(tmp_path) == 0.8
    late = threading.Timer(0.4, _append, (spans, _span("b" * 32, "newest", 2)))
    late.start()
    began = time.monotonic()
    found = find_trace(newest_spans(tmp_path, "last"), "last")
    late.join()
    assert [s["attributes"]["radixmesh.rid"] for s in found] == ["newest"]
    assert time.monotonic() - began >= 0.8
    # a request id is polled for, and found as soon as it is in
    _append(spans, _span("c" * 32, "third", 3))
    began = time.monotonic()
    assert find_trace(newest_spans(tmp_path, "third"), "third")
    assert time.monotonic() - began < 0.5


def test_without_a_running_stack_nothing_waits(tmp_path):
    _append(tmp_path / SPANS_FILE, _span("a" * 32, "only", 1))
    assert export_delay(tmp_path) == 0.0
    (tmp_path / "stack.json").write_text(json.dumps({"pid": 2 ** 22 + 12345, "spans": True}))
    assert export_delay(tmp_path) == 0.0  # that launcher is gone
    began = time.monotonic()
    assert find_trace(newest_spans(tmp_path, "last"), "last")[0]["attributes"]["radixmesh.rid"] == "only"
    assert time.monotonic() - began < 0.2
