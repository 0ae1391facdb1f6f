"""Lesson 03's experiment: per-parameter vs bucketed all-reduce, counted from the run itself."""
import pytest

from dpteach.experiments import bucket_assignment, bucket_size_sweep


def test_assignment_is_reverse_order_with_a_smaller_first_bucket():
    plan = bucket_assignment("mlp", bucket_mb=4.0)
    buckets = plan["buckets"]
    assert plan["parameters"][-1] == "net.10.bias" and plan["first_bucket_mb"] == 1.0
    assert buckets[0]["params"][0] == "net.10.bias"  # the last layer's gradients are ready first
    assert buckets[-1]["params"][-1] == "net.0.weight"
    assert [b["index"] for b in buckets] == list(range(len(buckets)))
    assert sum(b["bytes"] for b in buckets) == plan["grad_bytes"] == 4 * 1089034
    assert buckets[0]["bytes"] < buckets[1]["bytes"]  # first cap is a quarter of the cap
    assert len(bucket_assignment("mlp", bucket_mb=64.0)["buckets"]) == 1
    assert len(bucket_assignment("mlp", bucket_mb=0.01)["buckets"]) == 6  # each bias rides with its weight
    assert len(bucket_assignment("mlp", bucket_mb=0.001)["buckets"]) == 11  # ... until even a bias exceeds the cap


@pytest.fixture(scope="module")
def sweep():
    return bucket_size_sweep(world_size=2, model="mlp", bucket_sizes_mb=(0.01, 64), steps=3, batch_per_rank=8)


@pytest.mark.slow  # more than 4 s on 2 cores: in `make test`, not `make test-fast`
def test_messages_counted_in_the_run_match_the_bucket_count(sweep):
    rows = {r["label"]: r for r in sweep["rows"]}
    assert set(rows) == {"local", "naive", "0.01 MiB", "64 MiB"}
    assert rows["local"]["messages_per_step"] == 0
    assert rows["naive"]["messages_per_step"] == sweep["num_tensors"] == 12
    assert rows["0.01 MiB"]["messages_per_step"] == rows["0.01 MiB"]["num_buckets"] == 6
    assert rows["64 MiB"]["messages_per_step"] == rows["64 MiB"]["num_buckets"] == 1


def test_bucketing_changes_messages_not_bytes_nor_results(sweep):
    exact = [r for r in sweep["rows"] if r["strategy"] != "local"]
    assert len({r["bytes_per_step"] for r in exact}) == 1
    assert all(r["max_abs_diff_vs_naive"] <= 1e-6 and r["replicas_identical"] for r in exact)
    for r in exact:
        assert r["predicted_latency_s"] == pytest.approx(r["messages_per_step"] * sweep["latency_per_allreduce_s"])
        assert r["step_time_s"] > 0 and r["comm_s"] >= 0
    assert sweep["alpha_s"] >= 0 and sweep["latency_per_allreduce_s"] == pytest.approx(2 * sweep["alpha_s"])


@pytest.mark.parametrize("kwargs, word", [({"bucket_sizes_mb": (0,)}, "bucket_sizes_mb"), ({"model": "x"}, "model"),
                                          ({"world_size": 1}, "world_size"), ({"steps": 1}, "steps")])
def test_bad_arguments_fail_before_any_rank_starts(kwargs, word):
    with pytest.raises(ValueError, match=word):
        bucket_size_sweep(**kwargs)


def test_every_row_carries_the_interval_of_its_timed_steps(sweep):
    for r in sweep["rows"]:
        step = r["step_spread"]
        assert step["n"] == sweep["steps"] - 2  # the first two steps warm up and are not timed
        assert step["low"] <= step["median"] <= step["high"]
        if r["strategy"] != "local":
            exposed = r["exposed_spread"]
            assert exposed["n"] == step["n"] and 0 <= exposed["low"] <= exposed["median"] <= exposed["high"]


def test_the_sweep_plots_each_point_inside_its_own_interval(sweep):
    """The ranks' mean of their medians can fall outside the interval of the per-step means (two timed steps):
    the plot and the table take the interval's own median, so no error bar is negative."""
    import copy

    import matplotlib
    matplotlib.use("Agg")
    from dpteach.widgets.bucketing import plot_sweep
    result = copy.deepcopy(sweep)
    for r in result["rows"]:
        r["exposed_comm_s"] = 10.0  # far outside every interval
    plot_sweep(result)  # raised "'yerr' must not contain negative values" before
