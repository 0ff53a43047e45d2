"""ThreadChooser: each step size runs on the thread count measured fastest for it, and keeps trying the others."""

import pytest

from services.gpu_worker.threads import ThreadChooser


def run(chooser: ThreadChooser, tokens: int, per_token_s: dict[int, float], steps: int) -> list[int]:
    """``steps`` steps of ``tokens`` tokens where n threads take per_token_s[n] seconds a token."""
    picked = []
    for _ in range(steps):
        n = chooser.choose(tokens)
        chooser.record(tokens, n, per_token_s[n] * tokens)
        picked.append(n)
    return picked


def test_the_counts_are_one_half_and_all():
    assert ThreadChooser(1).counts == (1,)
    assert ThreadChooser(2).counts == (1, 2)
    assert ThreadChooser(3).counts == (1, 3)
    assert ThreadChooser(16).counts == (1, 8, 16)
    with pytest.raises(ValueError):
        ThreadChooser(0)


def test_each_size_settles_on_its_own_fastest_count():
    chooser = ThreadChooser(2, explore_every=10)
    small = run(chooser, 1, {1: 0.030, 2: 0.036}, 100)   # 1-row decode: one thread wins
    big = run(chooser, 64, {1: 0.0026, 2: 0.0015}, 100)  # 64-row decode: two win
    assert small[:2] == [2, 1]  # the first size tries each count once, the largest first
    assert big[0] == 1  # a new size starts from the nearest measured one's choice ...
    assert big[10] == 2 and big[11:].count(2) >= 80  # ... until its own try of the other count corrects it
    assert small[2:].count(1) >= 85  # (its first tries of 2 come every 2 steps until it has 3)
    assert 2 in small[10:] and 1 in big[11:]  # the other count is still tried now and then
    table = chooser.table()
    assert table[1][1] < table[1][2] and table[7][2] < table[7][1]


def test_a_change_in_the_machine_moves_the_choice():
    chooser = ThreadChooser(2, explore_every=8)
    assert run(chooser, 32, {1: 0.003, 2: 0.002}, 39)[-7:] == [2] * 7  # step 40 would be a try of 1
    # another process takes the second core: two threads now run 2x slower than one
    after = run(chooser, 32, {1: 0.003, 2: 0.006}, 60)
    assert after[5:].count(1) >= 45  # timed every step, the count in use is left at once (2 is still tried every 8th)
    # and back when the core is free again: only the tries of two threads can see it
    back = run(chooser, 32, {1: 0.003, 2: 0.002}, 60)
    assert back[-20:].count(2) >= 17


def test_three_counts_take_turns_being_tried():
    chooser = ThreadChooser(16, explore_every=4)
    picked = run(chooser, 128, {1: 0.010, 8: 0.002, 16: 0.003}, 80)
    assert picked[:3] == [16, 8, 1]
    later = picked[3:]
    assert later.count(8) >= 52 and 1 in later and 16 in later


def test_sizes_are_powers_of_two_and_one_thread_is_never_timed():
    assert [ThreadChooser.size_of(n) for n in (0, 1, 2, 3, 4, 7, 8, 1024)] == [1, 1, 2, 2, 3, 3, 4, 11]
    single = ThreadChooser(1)
    assert run(single, 8, {1: 0.01}, 5) == [1] * 5 and single.table() == {}


def test_a_new_size_takes_the_nearest_measured_sizes_ratios():
    """A cold worker's prefill chunks: the first 1024-token chunk must not run on one thread
    when 512-token chunks already showed two threads twice as fast."""
    chooser = ThreadChooser(2, explore_every=32)
    assert run(chooser, 512, {1: 0.002, 2: 0.001}, 3) == [2, 1, 2]
    assert run(chooser, 1024, {1: 0.002, 2: 0.001}, 5) == [2] * 5
    single = run(chooser, 1, {1: 0.010, 2: 0.012}, 40)
    assert single[:31] == [2] * 31  # the nearest measured size said 2 (fewer threads are not tried early) ...
    assert single[31:] == [1] * 9  # ... until this size's first try of 1 replaced the prior
    table = chooser.table()
    assert table[11][1] == pytest.approx(2.0) and table[11][2] == pytest.approx(1.0)  # the prior, rescaled


def test_a_few_slow_steps_do_not_move_the_choice():
    """Step times are noisy one way: a step a service preempted runs slow. Two such steps in a
    row on two threads must not send the next dozens of steps to one thread, 1.25x slower
    (seen in the stack at batch 1 with a moving average: 10-13% of steps on one thread)."""
    chooser = ThreadChooser(2, explore_every=32)
    warm = run(chooser, 1, {1: 0.020, 2: 0.016}, 40)
    assert [i + 1 for i, n in enumerate(warm) if n == 1] == [2, 32]  # fewer threads: tried at the usual pace
    for spike in (0.035, 0.040):  # two preempted steps on the count in use
        assert chooser.choose(1) == 2
        chooser.record(1, 2, spike)
    assert run(chooser, 1, {1: 0.020, 2: 0.016}, 21) == [2] * 21  # steps 43-63 (64 is the next try of 1)


def test_the_choice_moves_only_for_a_clear_gain():
    """Another count only a little faster than the one in use (within the margin): the one in
    use stays, rather than following every small difference the noise makes."""
    chooser = ThreadChooser(2, explore_every=8, margin=0.05)
    run(chooser, 8, {1: 0.0120, 2: 0.0102}, 24)  # two threads clearly faster; both timed 3+ times
    picked = run(chooser, 8, {1: 0.0099, 2: 0.0102}, 40)  # one thread now 3% faster
    assert [n for step, n in enumerate(picked, start=25) if step % 8] == [2] * 35  # all but the tries
    moved = run(chooser, 8, {1: 0.0090, 2: 0.0102}, 16)  # 12% faster: the choice moves
    assert moved[-7:-1] == [1] * 6  # (the last, step 80, a try of two)


def test_one_fast_try_brings_back_the_count_a_burst_of_load_left():
    """Seen at batch 1: a burst slowed every two-thread step for a while (the choice rightly
    moved to one); when it passed, the next try of two threads was fast again, and the choice
    must come back at once, not after several tries 32 steps apart."""
    chooser = ThreadChooser(2, explore_every=8)
    run(chooser, 1, {1: 0.018, 2: 0.014}, 16)
    burst = run(chooser, 1, {1: 0.018, 2: 0.030}, 10)  # steps 17-26: one try of two in it (a second would confirm it)
    assert burst[-5:] == [1, 1, 2, 1, 1]  # step 24 the try
    after = run(chooser, 1, {1: 0.018, 2: 0.014}, 16)
    first_two = after.index(2)
    assert first_two < 8 and after[first_two:].count(2) >= len(after) - first_two - 1


def test_a_cold_first_step_is_tried_again_soon():
    """A size's first step on two threads ran cold (1.9x its speed): one thread looks faster,
    and two must be tried again within a quarter of explore_every, not after it."""
    chooser = ThreadChooser(2, explore_every=32)
    assert chooser.choose(8) == 2
    chooser.record(8, 2, 8 * 0.030)
    picked = run(chooser, 8, {1: 0.020, 2: 0.016}, 24)
    assert picked[:6] == [1] * 6 and picked[6] == 2  # step 8: the next try of 2 ...
    assert picked[8:].count(2) >= 15  # ... and two from then on, save the tries of one


def test_tries_of_a_count_far_slower_slow_down_and_resume_when_it_is_not():
    """Each try of a count 1.4x slower costs 0.4 of a step: after two such tries in a row they
    come 4x less often; a try that is not far slower puts them back at the usual pace."""
    chooser = ThreadChooser(2, explore_every=8)
    picked = run(chooser, 8, {1: 0.0200, 2: 0.0140}, 160)
    tries = [step for step, n in enumerate(picked, start=1) if n == 1]
    assert tries == [2, 8, 16, 32, 64, 96, 128, 160]  # every 8th until two far tries (8, 16), then every 4 * 8
    later = run(chooser, 8, {1: 0.0150, 2: 0.0140}, 64)  # one thread now close: tried every 8th again
    assert [step for step, n in enumerate(later, start=161) if n == 1] == [192, 200, 208, 216, 224]


def test_fewer_threads_are_not_tried_early_on_big_steps():
    """A new prefill size whose prior says two threads: a try of one costs a 512-token chunk
    hundreds of ms of TTFT, so it waits for the usual pace (while more threads, cheap to try,
    come early: test_a_cold_first_step_is_tried_again_soon)."""
    chooser = ThreadChooser(2, explore_every=32)
    run(chooser, 256, {1: 0.0020, 2: 0.0011}, 40)  # a measured neighbour
    chunks = run(chooser, 512, {1: 0.0020, 2: 0.0011}, 31)
    assert chunks == [2] * 31


def test_a_size_seen_before_any_neighbour_was_measured_takes_one_when_there_is_one():
    """A cold stack: the first request's prefill (512-token class) runs on two threads before
    any size is timed on both; its decode steps then time one and two threads cheaply. The
    second request's prefill takes their ratios instead of trying one thread on itself
    (a 290-token prompt's TTFT went 545 -> 957 ms on that try)."""
    chooser = ThreadChooser(2, explore_every=32)
    assert run(chooser, 300, {1: 0.0020, 2: 0.0011}, 1) == [2]
    assert run(chooser, 1, {1: 0.020, 2: 0.016}, 3) == [2, 1, 2]  # a new size, nothing known: both tried
    assert run(chooser, 290, {1: 0.0020, 2: 0.0011}, 8) == [2] * 8
    assert chooser.table()[9][1] == pytest.approx(1.1 * 0.020 / 0.016, rel=1e-6)  # the prior on its own scale


def test_without_a_measured_neighbour_a_size_still_tries_every_count():
    chooser = ThreadChooser(2, explore_every=32)
    assert run(chooser, 300, {1: 0.0020, 2: 0.0011}, 3) == [2, 1, 2]
