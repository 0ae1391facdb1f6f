"""Lesson 01's memory arithmetic, held to the ZeRO paper's example and to the real optimizer tensors."""
import pytest

from dpteach.experiments import measure_model_memory, memory_per_replica


def test_zero_paper_example_7_5b_adam_mixed_64_gpus():
    # Rajbhandari et al. 2020, Figure 1: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB per GPU
    result = memory_per_replica(7.5, "adam", "mixed", world_size=64)
    totals = [s["total"] / 1e9 for s in result["by_stage"]]
    assert totals == pytest.approx([120.0, 31.4, 16.6, 1.9], abs=0.05)
    assert result["bytes_per_param"] == {"params": 2, "grads": 2, "optimizer": 12, "total": 16}


def test_plain_data_parallelism_does_not_shrink_with_more_ranks():
    one = memory_per_replica(7.0, world_size=1)["by_stage"][0]["total"]
    many = memory_per_replica(7.0, world_size=1024)["by_stage"][0]["total"]
    assert one == many
    result = memory_per_replica(7.0, "adam", "mixed", world_size=8, gpu_gb=80)
    assert not result["by_stage"][0]["fits"] and result["by_stage"][3]["fits"]
    assert result["max_params_billion"][0] == pytest.approx(5.0)
    sizes = [result["max_params_billion"][s] for s in range(4)]
    assert sizes == sorted(sizes)


def test_each_stage_shards_one_more_part():
    stages = memory_per_replica(1.0, "sgd_momentum", "fp32", world_size=4)["by_stage"]
    assert [s["optimizer"] for s in stages] == [4e9, 1e9, 1e9, 1e9]
    assert [s["grads"] for s in stages] == [4e9, 4e9, 1e9, 1e9]
    assert [s["params"] for s in stages] == [4e9, 4e9, 4e9, 1e9]


def test_measured_tensors_match_the_table():
    rows = measure_model_memory(models=("mlp", "transformer"))
    assert {(r["model"], r["optimizer"]) for r in rows} == {
        (m, o) for m in ("mlp", "transformer") for o in ("sgd_momentum", "adam")}
    for r in rows:
        assert r["param_bytes"] == r["predicted"]["params"] == 4 * r["num_params"]
        assert r["grad_bytes"] == r["predicted"]["grads"]
        assert r["state_bytes"] == r["predicted"]["optimizer"]
        # Adam also keeps a tiny step counter per tensor; momentum SGD keeps nothing else
        assert (r["other_state_bytes"] > 0) == (r["optimizer"] == "adam")
        assert r["other_state_bytes"] <= 8 * r["num_tensors"]


@pytest.mark.parametrize("kwargs, word", [({"optimizer": "lamb"}, "optimizer"), ({"zero_stage": 4}, "zero_stage"),
                                          ({"precision": "fp8"}, "precision"), ({"world_size": 0}, "world_size"),
                                          ({"params_billion": -1}, "params_billion"), ({"gpu_gb": 0}, "gpu_gb")])
def test_bad_arguments_name_themselves(kwargs, word):
    with pytest.raises(ValueError, match=word):
        memory_per_replica(**kwargs)


def test_zero_traffic_stages_one_and_two_equal_the_all_reduce_stage_three_is_one_and_a_half():
    """ZeRO section 7: 2 Psi elements per step for plain DP and stages 1-2, 3 Psi for stage 3."""
    for precision, grad_bytes in (("mixed", 2), ("fp32", 4)):
        result = memory_per_replica(1.0, "adam", precision, world_size=8)
        traffic = [stage["traffic_bytes"] for stage in result["by_stage"]]
        assert traffic[0] == traffic[1] == traffic[2] == pytest.approx(2 * 1e9 * grad_bytes * 7 / 8)
        assert traffic[3] == pytest.approx(1.5 * traffic[0])
    assert all(stage["traffic_bytes"] == 0 for stage in memory_per_replica(1.0, world_size=1)["by_stage"])
