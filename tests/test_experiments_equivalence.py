"""Lesson 01's identity on real ranks: the averaged shard gradients equal the global-batch gradient."""
import pytest

from dpteach.experiments import gradient_equivalence


@pytest.fixture(scope="module")
def result():
    return gradient_equivalence(world_size=2, batch_per_rank=8, model="mlp", accum_steps=2)


def test_averaged_gradient_equals_the_large_batch_gradient(result):
    assert result["rel_error"] <= result["tolerance"]
    assert result["max_abs_diff"] < 1e-6
    assert result["norm_averaged"] == pytest.approx(result["norm_single"], rel=1e-5)


def test_one_rank_alone_is_far_from_it(result):
    # each rank saw a quarter of the samples: its own gradient is a noisy estimate, not the answer
    assert all(e > 100 * max(result["rel_error"], 1e-9) for e in result["local_rel_errors"])


def test_shards_partition_the_global_batch_of_b_w_k(result):
    assert result["global_batch"] == 8 * 2 * 2
    shards = result["shards"]
    assert [len(s) for s in shards] == [16, 16]
    assert not set(shards[0]) & set(shards[1])
    assert len(set(shards[0]) | set(shards[1])) == result["global_batch"]
    assert result["num_params"] == 1089034


@pytest.mark.parametrize("kwargs, word", [({"model": "resnet"}, "model"), ({"batch_per_rank": 0}, "batch_per_rank"),
                                          ({"accum_steps": 1.5}, "accum_steps"), ({"world_size": 0}, "world_size")])
def test_bad_arguments_fail_before_any_rank_starts(kwargs, word):
    with pytest.raises(ValueError, match=word):
        gradient_equivalence(**kwargs)
