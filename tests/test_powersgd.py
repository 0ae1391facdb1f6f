"""PowerSGD (sync/powersgd.py) on real gloo ranks: equal to torch's powerSGD_hook on the same gradients, far
fewer bytes than DDP once compressing, plain data parallelism before it starts, bad knobs refused early."""
import pytest

from dpteach.experiments import compare as compare_module
from dpteach.experiments import powersgd as powersgd_module
from dpteach.experiments.compare import compare_strategies
from dpteach.experiments.powersgd import powersgd_against_torch
from dpteach.training.train import TrainConfig


@pytest.mark.slow  # more than 4 s on 2 cores: in `make test`, not `make test-fast`
@pytest.mark.parametrize("rank", [1, 4])
def test_equals_torch_hook_on_the_same_gradients(rank):
    out = powersgd_against_torch(2, rank=rank, steps=5, start=2)
    rows = out["rows"]
    assert [row["compressed"] for row in rows] == [False, False, True, True, True]  # warm start and error
    for row in rows:  # feedback carry state into steps 3 and 4
        assert row["max_abs_diff"] <= 1e-5, row
        assert row["course_bytes"] == row["torch_bytes"] == row["course_comm_bytes"]
        assert row["course_all_reduces"] == row["torch_all_reduces"]
    assert all(row["course_bytes"] < row["uncompressed_bytes"] / 10 for row in rows if row["compressed"])
    assert out["compression_ratio"] == out["torch_compression_ratio"] > 10


def _bytes_by_step(run) -> dict:
    """Bytes one rank put on the wire in each step, from its exchanges on the timeline."""
    per_step = {}
    for span in run["spans"]:
        if span["lane"] == "comm":
            per_step[span["step"]] = per_step.get(span["step"], 0) + span.get("bytes", 0)
    return per_step


@pytest.mark.slow  # 6 s: two trainings on real ranks
def test_sends_a_tenth_of_ddp_once_compressing():
    start, steps = 2, 4
    out = compare_strategies(4, strategies=["ddp", "powersgd"], steps=steps, batch_per_rank=8,
                             knobs={"powersgd_start": start, "powersgd_rank": 4})
    ddp = next(row for row in out["rows"] if row["strategy"] == "ddp")["bytes_per_step"]
    for run in out["runs"]["powersgd"]:
        sent = _bytes_by_step(run)
        assert [sent[s] for s in range(start)] == [ddp] * start  # plain steps: DDP's bytes exactly
        # only the compressing steps count here (the row's bytes_per_step averages in the plain ones)
        assert all(sent[s] <= ddp / 10 for s in range(start, steps)), (sent, ddp)


def test_before_start_it_is_plain_data_parallel_training():
    out = compare_strategies(2, strategies=["powersgd"], steps=3, knobs={"powersgd_start": 3}, batch_per_rank=8)
    row = out["rows"][0]
    assert row["max_abs_diff_vs_single"] <= out["tolerance"] and row["replicas_identical"]


@pytest.mark.parametrize("options, name", [({"knobs": {"powersgd_rank": 0}}, "powersgd_rank=0"),
                                           ({"knobs": {"powersgd_start": -1}}, "powersgd_start=-1"),
                                           ({"knobs": {"powersgd_error_feedback": "yes"}},
                                            "powersgd_error_feedback='yes'"),
                                           ({"precision": "fp16"}, "precision='fp16'")])
def test_bad_knob_refused_before_any_process(monkeypatch, options, name):
    def no_launch(*args, **kwargs):
        raise AssertionError("a process was started")
    monkeypatch.setattr(compare_module, "launch", no_launch)
    monkeypatch.setattr(powersgd_module, "launch", no_launch)
    with pytest.raises(ValueError, match=name.replace("(", r"\(")):
        compare_strategies(2, strategies=["powersgd"], steps=2, **options)
    with pytest.raises(ValueError, match="rank=0"):
        powersgd_against_torch(2, rank=0)
    with pytest.raises(ValueError, match="start=1"):
        powersgd_against_torch(2, start=1)


def test_runs_on_an_emulated_link():
    out = compare_strategies(2, strategies=["powersgd"], steps=3, knobs={"powersgd_start": 1}, batch_per_rank=8,
                             link="1gbe")
    report = out["rows"][0]["link_report"]
    assert report is not None and report["time_set_by"]
    assert report["messages_per_step"] == (5 + 2 * 15) / 3  # 5 buckets: one message each, then three (rest, P, Q)


@pytest.mark.slow
def test_trained_side_by_side_it_equals_ddp_with_torch_s_own_hook():
    """``powersgd_torch`` is DDP with torch's powerSGD_hook registered: the oracle for the whole training run,
    not only one round. With one bucket (DDP's 25 MB) both see the same tensors in the same order."""
    report = compare_strategies(2, strategies=["powersgd", "powersgd_torch"], steps=6, bucket_mb=25.0,
                                knobs={"powersgd_start": 2})
    ours, torchs = (report["runs"][name][0]["params"] for name in ("powersgd", "powersgd_torch"))
    assert (ours - torchs).abs().max().item() <= 1e-5
    rows = {row["strategy"]: row for row in report["rows"]}
    assert rows["powersgd"]["bytes_per_step"] == rows["powersgd_torch"]["bytes_per_step"]
    assert rows["powersgd_torch"]["link_report"] is None  # torch's hook sends past the course's link
    with pytest.raises(ValueError, match="powersgd_start=1"):
        TrainConfig(strategy="powersgd_torch", knobs={"powersgd_start": 1}).check(2)


@pytest.mark.slow  # 3 ranks, several DDP buckets
def test_torch_s_hook_with_several_buckets_runs_on_three_ranks_without_a_collective_mismatch():
    """torch's hook launches a bucket's Q all-reduce from a callback; unless the next bucket waits for it, the
    ranks launch collectives in different orders and gloo pairs the wrong messages (it aborted, or hung)."""
    out = compare_strategies(3, strategies=["powersgd_torch"], steps=4, bucket_mb=0.25, batch_per_rank=8,
                             knobs={"powersgd_start": 2}, timeout=120)
    row = out["rows"][0]
    assert row["replicas_identical"] and row["bytes_per_step"] < out["runs"]["powersgd_torch"][0]["wire_bytes"][0]
