"""Lesson 00's experiment: the machine description and the all-reduce sweep with its alpha-beta fit."""
import pytest

from dpteach.ranks.backend import choose_placement
from dpteach.experiments import machine_profile
from dpteach.experiments.machine import describe_machine, measured


@pytest.fixture(scope="module")
def profile():
    return machine_profile(world_size=2, sizes=("4KiB", "256KiB", "1MiB"), iters=2, warmup=0)


def test_profile_has_a_row_per_size_and_algorithm(profile):
    assert profile["sizes"] == [4096, 256 * 1024, 1 << 20]
    assert {(r["algorithm"], r["bytes"]) for r in profile["rows"]} == {
        (a, n) for a in ("builtin", "ring") for n in profile["sizes"]}
    for row in profile["rows"]:
        assert row["time_s"] > 0
        assert row["algbw_GBps"] == pytest.approx(row["bytes"] / row["time_s"] / 1e9)
        assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"])  # 2(W-1)/W = 1 at W = 2
    assert measured(profile, "ring") == [next(r["time_s"] for r in profile["rows"]
                                              if r["algorithm"] == "ring" and r["bytes"] == n)
                                         for n in profile["sizes"]]


def test_fit_is_physical_and_predictions_follow_it(profile):
    fit = profile["fit"]
    assert fit["alpha_s"] >= 0 and fit["beta_s_per_byte"] >= 0
    assert len(profile["predicted_s"]) == len(profile["sizes"])
    # the ring formula at W=2: 2 alpha + n beta; never decreasing in n
    for n, t in zip(profile["sizes"], profile["predicted_s"]):
        assert t == pytest.approx(2 * fit["alpha_s"] + n * fit["beta_s_per_byte"])
    assert profile["predicted_s"] == sorted(profile["predicted_s"])


def test_machine_description_matches_the_placement_rule(profile):
    m = profile["machine"]
    assert m["cpus"] >= 1 and isinstance(m["gpus"], list)
    assert m["placement"]["backend"] == choose_placement(2).backend == profile["backend"]
    assert describe_machine(3)["placement"]["world_size"] == 3


@pytest.mark.parametrize("kwargs, word", [({"world_size": 1}, "world_size"), ({"sizes": ("4KiB",)}, "sizes"),
                                          ({"algorithms": ("builtin",)}, "algorithms")])
def test_bad_arguments_fail_before_any_rank_starts(kwargs, word):
    with pytest.raises(ValueError, match=word):
        machine_profile(**kwargs)
