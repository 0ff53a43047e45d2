"""Fault injection rules: which received messages a test makes the bus drop."""

from __future__ import annotations

import pytest

from libs.protocol.faults import parse, should_drop


def test_the_nth_messages_on_matching_subjects_are_dropped():
    rules = parse("rm.tokenizer.detok.*@2:4, rm.gw.*.out@1")
    got = [should_drop(rules, "rm.tokenizer.detok.t1") for _ in range(5)]
    assert got == [False, True, False, True, False]
    assert should_drop(rules, "rm.gw.g1.out") and not should_drop(rules, "rm.gw.g1.out")
    assert not should_drop(rules, "rm.sched.w1.submit")


@pytest.mark.parametrize("spec", ["nosign", "a.b@", "@3", "a.b@x", "a.b@0"])
def test_bad_rules_are_refused(spec):
    with pytest.raises(ValueError, match="RADIXMESH_FAULT_DROP"):
        parse(spec)


def test_no_rules_when_unset():
    assert parse("") == []
