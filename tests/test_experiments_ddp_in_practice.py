"""What DDP and the data really do, read from real gloo worlds: DDP's own buckets, unused parameters,
bucket views, a forgotten sampler, an uneven last batch and a mismatched collective.

Every world here is forced onto CPU ranks with gloo, so the assertions hold whatever GPUs the
machine has; torch itself (its DDP object, its profiler, its tensors' storages) is the oracle."""
import pytest

from dpteach.experiments import (bucket_view_memory, collective_mismatch, ddp_bucket_assignment, sampler_sharding,
                                 uneven_inputs, unused_parameters)

CPU = {"backend": "gloo", "device": "cpu"}
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def default_buckets():
    return ddp_bucket_assignment("mlp", **CPU)


def test_ddp_starts_with_one_bucket_then_rebuilds_in_ready_order(default_buckets):
    first, second, third = default_buckets["iterations"]
    assert [len(b["params"]) for b in first["buckets"]] == [len(default_buckets["parameters"])]
    assert first["collectives"] == ["all_reduce"]
    assert default_buckets["rebuilt"] and len(second["buckets"]) > 1
    assert second["collectives"].count("broadcast") >= 1  # rank 0's new assignment, sent to every rank
    assert third["buckets"] == second["buckets"] and third["collectives"] == ["all_reduce"] * len(third["buckets"])
    flat = [name for bucket in second["buckets"] for name in bucket["params"]]
    assert flat == first["ready_order"]  # the rebuilt buckets follow the order gradients became ready
    assert default_buckets["ranks_agree"]


def test_default_cap_gives_a_one_mib_first_bucket_and_matches_the_simple_rule_on_the_mlp(default_buckets):
    sizes = [b["bytes"] for b in default_buckets["iterations"][-1]["buckets"]]
    first_params = default_buckets["iterations"][-1]["buckets"][0]["params"]
    assert default_buckets["first_cap_bytes"] == MiB and default_buckets["cap_bytes"] == 25 * MiB
    # closed by the parameter that crossed 1 MiB, and not one parameter later
    assert sizes[0] >= MiB > sizes[0] - default_buckets["param_bytes"][first_params[-1]]
    assert default_buckets["same_as_course_rule"]  # a chain of layers: ready order = reverse definition order
    assert [int(s) for s in default_buckets["logging"]["rebuilt_bucket_sizes"].split(",")] == sizes


def test_an_explicit_cap_applies_to_the_first_bucket_too():
    plan = ddp_bucket_assignment("mlp", bucket_cap_mb=2.0, iterations=2, **CPU)
    first = plan["iterations"][-1]["buckets"][0]
    assert plan["first_cap_bytes"] == plan["cap_bytes"] == 2 * MiB
    assert first["bytes"] >= 2 * MiB


def test_find_unused_parameters_keeps_a_reversed_static_assignment():
    plan = ddp_bucket_assignment("mlp", find_unused_parameters=True, **CPU)
    buckets = plan["iterations"][-1]["buckets"]
    assert not plan["rebuilt"]
    assert all(it["buckets"] == buckets for it in plan["iterations"])
    assert plan["parameters"][0] in buckets[-1]["params"]  # the first-defined layer is reduced last
    assert buckets[-1]["bytes"] < buckets[0]["bytes"]       # ... in the small bucket
    # one all-reduce per bucket plus the bitmap of used parameters, every iteration
    assert all(it["collectives"].count("all_reduce") == len(buckets) + 1 for it in plan["iterations"])


def test_on_the_transformer_ddp_follows_the_ready_order_not_the_simple_rule():
    plan = ddp_bucket_assignment("transformer", **CPU)
    ready = plan["iterations"][0]["ready_order"]
    assert ready != plan["parameters"][::-1]
    assert [n for b in plan["iterations"][-1]["buckets"] for n in b["params"]] == ready
    assert not plan["same_as_course_rule"]


def test_unused_parameters_default_fails_and_the_options_work():
    result = unused_parameters(model="mlp", steps=6, batch_per_rank=8, **CPU)
    default = result["default"]
    assert default["first_collectives"] == []      # the one bucket never became ready ...
    assert default["first_grad_spread"] > 0        # ... so the ranks' gradients were never averaged
    assert "Expected to have finished reduction in the prior iteration" in default["error"]
    rows = {r["setting"]: r for r in result["rows"]}
    for name in ("find_unused_parameters", "static_graph"):
        assert rows[name]["spare_grads_none"] and rows[name]["replica_spread"] == 0.0
    baseline = rows["no spare head"]["collectives_per_step"][-1]
    assert rows["find_unused_parameters"]["collectives_per_step"][-1] == baseline + 1  # the used-map all-reduce
    assert rows["static_graph"]["collectives_per_step"][-1] == baseline
    # steps 0-2 and the last are profiled; the two between are timed, each setting's with its interval
    for row in rows.values():
        step = row["step"]
        assert step["n"] == 2 and step["low"] <= row["median_step_s"] == step["median"] <= step["high"]
    ranked = result["ranking"]
    assert sorted(ranked["order"]) == sorted(rows) and ranked["order"][0] in ranked["leaders"]
    assert (ranked["winner"] is None) == (len(ranked["leaders"]) > 1)


def test_bucket_views_save_one_copy_of_the_gradients():
    rows = {r["gradient_as_bucket_view"]: r for r in bucket_view_memory(model="mlp", **CPU)["rows"]}
    copy, view = rows[False], rows[True]
    assert copy["grad_bytes"] == view["grad_bytes"] == copy["bucket_bytes"] == view["bucket_bytes"]
    assert copy["grads_in_buckets"] == 0 and copy["distinct_bytes"] == 2 * copy["grad_bytes"]
    assert view["grads_in_buckets"] == view["num_grads"] and view["distinct_bytes"] == view["grad_bytes"]


def test_without_a_distributed_sampler_every_rank_trains_on_the_same_samples():
    result = sampler_sharding(world_size=3, samples=48, batch_per_rank=4, **CPU)
    forgot, sharded = result["rows"]
    assert forgot["order"][0] == forgot["order"][1] == forgot["order"][2]
    assert not forgot["shards_disjoint"] and forgot["visits_per_sample"] == 3
    assert forgot["distinct_in_first_step"] == 4 and forgot["grad_spread"] == 0.0
    assert forgot["average_vs_own"] <= 1e-6 * forgot["grad_scale"]  # (g + g + g) / 3 is g, up to rounding
    assert sharded["shards_disjoint"] and sharded["covers_dataset"] and sharded["visits_per_sample"] == 1
    assert sharded["distinct_in_first_step"] == 12 and sharded["steps_per_epoch"] * 3 == forgot["steps_per_epoch"]
    assert sharded["average_vs_own"] > 1e-3 * sharded["grad_scale"]


@pytest.mark.slow
def test_an_uneven_last_batch_stalls_and_join_or_dropping_it_finishes():
    result = uneven_inputs(world_size=2, batches=3, batch_per_rank=8, stall_timeout_s=4, **CPU)
    plain = result["plain"]
    assert plain["outcome"] == "stalled", plain
    assert "step 4 of 4" in plain["where"][0] and "barrier" in plain["where"][1]
    fixes = {f["mode"]: f for f in result["fixes"]}
    assert fixes["join"]["steps_by_rank"] == [4, 3] and fixes["drop_last"]["steps_by_rank"] == [3, 3]
    assert all(f["replica_spread"] == 0.0 for f in fixes.values())


def test_a_mismatched_collective_crashes_gloo_and_detail_names_it():
    rows = {r["debug"]: r for r in collective_mismatch(world_size=2, **CPU)["rows"]}
    assert rows["OFF"]["outcome"] == "crashed" and "mismatch" in rows["OFF"]["message"]
    assert rows["OFF"]["exit_code"] < 0  # a native abort: a signal, no Python traceback
    assert rows["DETAIL"]["outcome"] == "raised"
    assert "Detected mismatch between collectives on ranks" in rows["DETAIL"]["message"]
    assert "TensorShape=[4]" in rows["DETAIL"]["message"] and "TensorShape=[6]" in rows["DETAIL"]["message"]


@pytest.mark.parametrize("call, argument", [
    (lambda: ddp_bucket_assignment("mlp", bucket_cap_mb=0, **CPU), "bucket_cap_mb=0"),
    (lambda: ddp_bucket_assignment("mlp", iterations=1, **CPU), "iterations=1"),
    (lambda: ddp_bucket_assignment("resnet", **CPU), "model='resnet'"),
    (lambda: unused_parameters(steps=2, **CPU), "steps=2"),
    (lambda: sampler_sharding(samples=4, batch_per_rank=8, **CPU), "samples=4"),
    (lambda: uneven_inputs(stall_timeout_s=0, **CPU), "stall_timeout_s=0"),
    (lambda: collective_mismatch(debug_levels=("LOUD",), **CPU), "debug_levels=('LOUD',)"),
])
def test_bad_arguments_are_named_before_any_rank_starts(call, argument):
    with pytest.raises(ValueError, match=__import__("re").escape(argument)):
        call()
