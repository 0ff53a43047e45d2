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


def test_a_decode_steps_growth_per_row_is_fitted_from_steps_of_varying_batch():
    rates = StepRates()
    for rows in range(1, 8):  # too few steps yet to say
        rates.measure([1] * rows, 0.05 + 0.008 * (rows - 1))
    assert rates.decode_row_s == 0.0
    for rows in [1, 3, 5, 8, 2, 6, 4, 7] * 4:
        rates.measure([1] * rows, 0.05 + 0.008 * (rows - 1) + 0.002 * (rows % 2))  # some noise
    assert rates.decode_row_s == pytest.approx(0.008, rel=0.1)
    fitted = rates.decode_row_s
    for _ in range(400):  # one batch size for a long time: nothing to tell rows apart by
        rates.measure([1] * 4, 0.074)
    assert rates.decode_row_s == pytest.approx(fitted, rel=0.2)
    rates.measure([1, 200], 0.25)  # prefill steps are not decode steps
    assert rates.decode.n > 0 and rates.decode_row_s == pytest.approx(fitted, rel=0.2)
