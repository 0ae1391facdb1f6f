"""accumulation_sweep on a real 2-rank world: bytes per sample, equivalence, and the two bugs."""
import pytest

from dpteach.experiments import accumulation_sweep
from dpteach.widgets.accumulation import k_values


@pytest.fixture(scope="module")
def result():
    return accumulation_sweep(2, accum_steps_list=(1, 2), steps=3, batch_per_rank=8)


@pytest.mark.slow  # more than 4 s on 2 cores: in `make test`, not `make test-fast`
def test_rows_and_communication_per_sample(result):
    one, two = result["rows"]
    assert (one["accum_steps"], two["accum_steps"]) == (1, 2)
    assert (one["effective_batch"], two["effective_batch"]) == (16, 32)
    assert one["bytes_per_step"] == two["bytes_per_step"] > 0
    assert one["messages_per_step"] == two["messages_per_step"]
    assert two["bytes_per_sample"] * 2 == one["bytes_per_sample"]
    assert one["comm_after_last_forward"] and two["comm_after_last_forward"]
    assert set(result["timelines"]) == {1, 2} and set(result["timelines"][2]) == {0, 1}
    forwards = [s for s in result["timelines"][2][0] if s["name"] == "forward"]
    assert len(forwards) == 2  # one step, two micro-batches
    for row in (one, two):  # the timed steps of each K, which took them in turn: the lesson's intervals
        assert row["spread"]["step_s"]["n"] == row["spread"]["exposed_s"]["n"] == 3 - 2
        assert row["compute_floor_spread"]["n"] == 3 - 2


def test_equal_to_single_process_training_on_the_large_batch(result):
    for row in result["rows"]:
        assert row["max_abs_diff_vs_large_batch"] <= result["tolerance"] and row["replicas_identical"]
    lb = result["loss_not_divided"]
    assert lb["max_abs_diff_divided"] <= lb["gradient_tolerance"]


def test_no_sync_after_forward_still_sends_every_micro_batch(result):
    ns = result["no_sync"]
    assert ns["k"] == 2
    assert ns["after_forward"]["bytes"] == 2 * ns["before_forward"]["bytes"] > 0
    assert ns["after_forward"]["all_reduces"] > ns["before_forward"]["all_reduces"] >= 1


def test_forgetting_to_divide_by_k_gives_k_times_the_gradient(result):
    lb = result["loss_not_divided"]
    assert lb["norm_ratio"] == pytest.approx(2.0, rel=1e-4)
    assert lb["max_abs_diff_not_divided_over_k"] <= lb["gradient_tolerance"]


def test_k_values_and_bad_arguments():
    assert k_values(1) == [1] and k_values(4) == [1, 2, 4] and k_values(6) == [1, 2, 4, 6]
    with pytest.raises(ValueError, match="strategy='int8' is not allowed"):
        accumulation_sweep(2, strategy="int8")
    with pytest.raises(ValueError, match="accum_steps_list"):
        accumulation_sweep(2, accum_steps_list=(0, 2))
