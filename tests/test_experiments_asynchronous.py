"""async_staleness on a real 3-rank world (a server and two workers)."""
import pytest

from dpteach.experiments import async_staleness
from dpteach.experiments.asynchronous import _in_company


@pytest.fixture(scope="module")
def result():
    return async_staleness(3, steps=6, slow_ms=40, max_staleness=0, repeats=2, batch_per_rank=8)


@pytest.mark.slow  # more than 4 s on 2 cores: in `make test`, not `make test-fast`
def test_runs_and_curves(result):
    kinds = [r["kind"] for r in result["runs"]]
    assert kinds == ["sync", "sync", "sync_slow", "slow", "async", "async", "bounded"]
    for run in result["runs"]:
        synchronous = run["kind"].startswith("sync")
        assert len(run["eval_curve"]) == (6 if synchronous else run["async"]["applied"])
        assert run["samples_per_update"] == (8 * 3 if synchronous else 8)
        times = [t for t, _ in run["eval_curve"]]
        assert times == sorted(times) and times[0] > 0  # seconds since the first step, one per update


def test_a_straggler_costs_the_synchronous_run_its_time(result):
    by = {run["label"]: run for run in result["runs"]}
    sync, straggling = by["sync run 2"], by["sync, rank 2 slow"]
    # Not a timing comparison (load can slow either run): a lower bound no load can overturn. Every
    # step of a synchronous run waits for the rank that sleeps 40 ms, so six steps take at least six
    # sleeps (less a little for the moment the ranks leave the starting barrier apart).
    assert straggling["eval_curve"][-1][0] >= 6 * 0.040 * 0.95
    assert [loss for _, loss in straggling["eval_curve"]] == [loss for _, loss in sync["eval_curve"]]  # same maths


def test_sync_is_reproducible_and_async_differences_come_from_the_order(result):
    assert result["sync_repeat_diff"] == 0.0
    for diff, differ in zip(result["async_repeat_diffs"], result["async_orders_differ"]):
        assert diff >= 0.0 and (diff > 0.0 or not differ)


def test_staleness_and_the_bound(result):
    assert result["slow_rank"] == 2 and set(result["staleness"]) <= {1, 2}
    assert sum(len(v) for v in result["staleness"].values()) + result["pushes_alone"] == 12
    b = result["bounded"]
    assert b["max_staleness"] == 0 and b["pushes"] == 12 and b["applied"] + b["dropped"] == 12
    assert b["dropped"] == sum(s > 0 for s in b["staleness"])


def test_pushes_made_alone_are_told_apart():
    log = [{"worker": w} for w in (1, 2, 1, 1, 2, 2, 2)]
    assert _in_company(log) == [True, True, True, True, True, False, False]  # 2 pulled after 1 finished


def test_too_small_a_world_is_refused():
    with pytest.raises(ValueError, match="world_size=2 is not allowed"):
        async_staleness(2)
    with pytest.raises(ValueError, match="repeats=1 is not allowed"):
        async_staleness(3, repeats=1)
