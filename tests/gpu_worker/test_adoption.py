"""Adoption and lease rules, on a fake clock."""

from __future__ import annotations

import pytest

from libs.protocol import ServiceError
from services.gpu_worker.adoption import Adoption


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_one_owner_until_the_lease_lapses():
    clock = Clock()
    a = Adoption(clock)
    a.adopt("s1", 2.0)
    a.adopt("s1", 2.0)  # a retry by the owner is fine
    with pytest.raises(ServiceError) as err:
        a.adopt("s2", 2.0)
    assert (err.value.code, err.value.status) == ("already_adopted", 409)
    clock.now += 1.5
    a.renew("s1")
    clock.now += 1.5  # within the renewed lease
    assert not a.expire() and a.owner == "s1" and a.epoch == 0
    clock.now += 2.1
    assert a.expire() and a.owner is None and a.epoch == 1
    assert not a.expire() and a.epoch == 1
    a.adopt("s2", 5.0)
    assert a.owner == "s2"


def test_lapsed_lease_lets_another_scheduler_adopt():
    clock = Clock()
    a = Adoption(clock)
    a.adopt("s1", 1.0)
    clock.now += 1.01
    a.adopt("s2", 1.0)  # no explicit expire(): adopt notices the lapse itself
    assert (a.owner, a.epoch) == ("s2", 1)
    with pytest.raises(ServiceError) as err:
        a.renew("s1")
    assert (err.value.code, err.value.status) == ("not_adopted", 409)


def test_bad_adopt_requests_and_forward_guard():
    a = Adoption(Clock())
    for sid, lease in [("", 1.0), ("s", 0.0), ("s", -1.0), ("s", 1e9)]:
        with pytest.raises(ServiceError) as err:
            a.adopt(sid, lease)
        assert err.value.status == 400
    with pytest.raises(ServiceError):
        a.require_owner()
    a.adopt("s", 1.0)
    a.require_owner()


def test_a_step_from_a_stale_owner_or_an_old_adoption_is_refused():
    clock = Clock()
    a = Adoption(clock)
    a.adopt("s1", 5.0)
    a.require_owner("s1", 0)
    a.require_owner()  # unnamed steps (tools, tests) are only checked for an owner
    clock.now += 10  # s1's lease lapses; s2 adopts (epoch 1)
    a.adopt("s2", 5.0)
    for owner, epoch in (("s1", 0), ("s1", 1), ("s2", 0)):
        with pytest.raises(ServiceError) as err:
            a.require_owner(owner, epoch)
        assert (err.value.code, err.value.status) == ("stale_owner", 409)
    a.require_owner("s2", 1)


def test_the_owner_releases_and_another_adopts_at_once():
    a = Adoption(Clock())
    a.adopt("s1", 30.0)
    with pytest.raises(ServiceError):
        a.release("s2")  # only the owner may
    a.release("s1")
    assert (a.owner, a.epoch) == (None, 1)
    a.adopt("s2", 30.0)
    with pytest.raises(ServiceError) as err:
        a.require_owner("s1", 0)
    assert err.value.code == "stale_owner"
