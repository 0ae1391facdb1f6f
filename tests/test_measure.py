"""``dpteach.measure``: interleaved rounds, a median with an order-statistic interval, a ranking only when the
intervals separate."""
import random

import pytest

from dpteach.measure import CONFIDENCE, interleaved, median_interval_ranks, ranking, spread


@pytest.mark.parametrize("n", [5, 7, 10, 15, 31])
def test_the_interval_covers_the_median_as_often_as_it_says_and_is_the_narrowest_that_does(n):
    rng = random.Random(n)
    low, high = median_interval_ranks(n)
    trials, covered = 20_000, 0
    for _ in range(trials):  # samples from a skewed distribution whose median is known: exp(1) has median ln 2
        values = sorted(rng.expovariate(1.0) for _ in range(n))
        covered += values[low] <= 0.6931471805599453 <= values[high]
    claimed = spread(range(n)).coverage
    assert abs(covered / trials - claimed) < 0.012  # what it says is what happens
    assert claimed >= CONFIDENCE
    if high - low >= 2:  # one position narrower on each side would no longer cover enough
        narrower = sum(1 for _ in range(4000)
                       if (v := sorted(rng.expovariate(1.0) for _ in range(n)))[low + 1] <= 0.6931471805599453
                       <= v[high - 1]) / 4000
        assert narrower < CONFIDENCE


def test_five_rounds_give_the_whole_range_and_the_median():
    s = spread([0.3, 0.1, 0.5, 0.2, 0.4])
    assert (s.low, s.median, s.high, s.n) == (0.1, 0.3, 0.5, 5)
    assert s.text("s") == "0.3 s (0.1-0.5)" and s.scaled(1e3).median == 300.0


def test_interleaved_rounds_rotate_the_order_and_time_each_call():
    calls, clock = [], iter(range(1000))
    timed = interleaved({name: (lambda name=name: calls.append(name)) for name in "abc"}, rounds=3, warmup=1,
                        clock=lambda: next(clock))
    assert calls == list("abc" "bca" "cab" "abc")  # warmup round first, then no name always first
    assert set(timed) == {"a", "b", "c"} and all(s.n == 3 and s.median == 1 for s in timed.values())


def test_parts_that_time_themselves_keep_their_own_seconds_in_round_order_after_each_before():
    ran, waits = [], []
    items = {name: (lambda name=name: ran.append(name) or len(ran)) for name in "abc"}  # "seconds": the call's count
    samples = interleaved(items, rounds=3, warmup=1, before=lambda: waits.append(1), self_timed=True, samples=True)
    assert ran == list("abc" "bca" "cab" "abc") and len(waits) == len(ran)  # a before() ahead of every call
    assert samples == {"a": [6, 8, 10], "b": [4, 9, 11], "c": [5, 7, 12]}


def test_a_winner_only_when_the_intervals_separate():
    fast, slow = spread([1.0, 1.1, 1.05, 0.98, 1.02]), spread([1.5, 1.4, 1.6, 1.45, 1.55])
    noisy = spread([1.03, 1.2, 0.9, 1.1, 1.0])
    clear = ranking({"slow": slow, "fast": fast})
    assert clear.order == ["fast", "slow"] and clear.winner == "fast" and clear.leaders == ["fast"]
    assert clear.sentence("ms", 1e3, 0).startswith("`fast` is faster than every other beyond this machine's noise")
    tied = ranking({"fast": fast, "noisy": noisy, "slow": slow})
    assert tied.winner is None and tied.leaders == ["fast", "noisy"]
    assert "within this machine's noise" in tied.sentence() and tied.sentence().endswith("Behind them beyond the noise: `slow`.")


@pytest.mark.parametrize("call, message", [
    (lambda: spread([]), "samples=\\[\\] is not allowed"),
    (lambda: interleaved({}), "calls=\\{\\} is not allowed"),
    (lambda: interleaved({"a": lambda: None}, rounds=0), "rounds=0 is not allowed: it must be an integer >= 1"),
    (lambda: ranking({}), "spreads=\\{\\} is not allowed"),
])
def test_bad_input_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_the_order_turns_one_place_a_round_for_any_sequence():
    from dpteach.measure import turned
    assert [turned("abc", r) for r in range(4)] == [list("abc"), list("bca"), list("cab"), list("abc")]
    assert turned(range(3), 1) == [1, 2, 0]  # indices, as lesson 14's methods are taken
