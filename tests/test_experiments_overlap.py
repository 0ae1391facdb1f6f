"""overlap_timeline on a real 2-rank world: structure of the timelines, equivalence, the candidate answers."""
import pytest

from dpteach.experiments import overlap_timeline
from dpteach.training.accounting import step_structure, typical_step
from dpteach.training.reference import SGD_TOLERANCE


@pytest.fixture(scope="module")
def result():
    return overlap_timeline(2, model="mlp", steps=3, batch_per_rank=8)


def test_result_is_plain_data_with_every_run(result):
    assert {"world_size", "backend", "device", "tolerance", "strategies", "timelines", "candidates",
            "shown_steps", "timed_steps"} <= set(result)
    assert [r["strategy"] for r in result["strategies"]] == ["local", "naive", "bucketed", "overlap", "ddp", "int8"]
    assert [c["key"] for c in result["candidates"]] == ["today", "overlap", "int8", "accumulate", "smaller_batch"]
    for name, by_rank in result["timelines"].items():
        assert set(by_rank) == {0, 1}
        assert {s["step"] for spans in by_rank.values() for s in spans} == {result["shown_steps"][name]}


def test_exact_strategies_equal_single_process_training(result):
    assert result["tolerance"] == SGD_TOLERANCE
    for row in result["strategies"]:
        if row["exact"]:
            assert row["max_abs_diff_vs_single"] <= result["tolerance"] and row["replicas_identical"], row
    assert not next(r for r in result["strategies"] if r["strategy"] == "local")["replicas_identical"]


def test_only_overlap_and_ddp_communicate_during_backward(result):
    rows = {r["strategy"]: r for r in result["strategies"]}
    assert not rows["naive"]["starts_before_backward_ends"] and not rows["bucketed"]["starts_before_backward_ends"]
    assert rows["overlap"]["starts_before_backward_ends"] and rows["ddp"]["starts_before_backward_ends"]
    assert rows["naive"]["messages"] == 12 > rows["bucketed"]["messages"] == rows["overlap"]["messages"]
    assert rows["local"]["messages"] == 0 and rows["local"]["bytes_per_step"] == 0


def test_candidate_answers_cost_and_equivalence(result):
    c = {row["key"]: row for row in result["candidates"]}
    assert c["today"]["identical"] and c["overlap"]["identical"]
    assert not (c["int8"]["identical"] or c["accumulate"]["identical"] or c["smaller_batch"]["identical"])
    assert c["int8"]["bytes_per_step"] < c["today"]["bytes_per_step"]
    assert c["accumulate"]["bytes_per_step"] == c["smaller_batch"]["bytes_per_step"] == c["today"]["bytes_per_step"]
    assert c["accumulate"]["samples_per_step"] == 2 * c["today"]["samples_per_step"] == 4 * c["smaller_batch"]["samples_per_step"]
    for row in result["candidates"]:
        assert row["exposed_comm_s"] >= 0 and row["step_time_s"] > 0


def test_step_structure_reads_when_communication_started():
    spans = [{"step": 0, "name": "forward", "lane": "compute", "start": 0.0, "end": 1.0},
             {"step": 0, "name": "backward", "lane": "compute", "start": 1.0, "end": 3.0},
             {"step": 0, "name": "comm", "lane": "comm", "start": 2.0, "end": 4.0},
             {"step": 0, "name": "comm", "lane": "comm", "start": 3.5, "end": 5.0},
             {"step": 1, "name": "comm", "lane": "comm", "start": 9.0, "end": 9.5}]
    info = step_structure(spans, 0)
    assert info["messages"] == 2 and info["launch_lead_s"] == 1.0 and info["comm_s"] == 3.0
    assert typical_step([5.0, 1.0, 3.0, 2.0], range(1, 4)) == 3


def test_a_single_rank_is_refused_before_anything_starts():
    with pytest.raises(ValueError, match="world_size=1 is not allowed"):
        overlap_timeline(1)
