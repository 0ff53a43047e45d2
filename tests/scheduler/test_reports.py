"""Measured step rates: what a worker's load report tells the router."""

import pytest

from services.scheduler.reports import StepRates


def test_rates_come_from_the_kind_of_step_that_measures_them():
    rates = StepRates()
    rates.measure([1, 1, 1], 0.05)  # decode only
    rates.measure([1, 200], 0.25)  # mixed: prefill dominates
    rates.measure([1, 30], 0.9)  # too little prefill to say anything
    assert rates.decode_step_s == pytest.approx(0.05)
    assert rates.prefill_tps == pytest.approx(800.0)
    rates.copied(8, 1.0)  # too few tokens to time
    rates.copied(1000, 0.0)  # nothing timed (no copies ran)
    assert rates.host_load_tps == 0.0
    rates.copied(2000, 0.1)
    rates.copied(1000, 0.1)
    assert rates.host_load_tps == pytest.approx(0.8 * 20_000 + 0.2 * 10_000)
