"""Lesson 13's library: checkpoints that resume exactly after a real kill, at the same and at another W; faults
on purpose; the checkpoint interval. The oracle is the same run without a kill (bit for bit on CPU at the
same W, within the strategy's tolerance at another W)."""
import subprocess
import sys

import pytest

from dpteach import launch
from dpteach.experiments import (checkpoint_cost, checkpoint_interval, fault_detection, replica_groups, restart_run,
                                 resume_equivalence)
from dpteach.experiments.failures import FAULT_NAMES, fault_row
from dpteach.experiments.torchft_groups import torchft_missing
from dpteach.ranks.faults import Fault
from dpteach.ranks.processes import RankError
from dpteach.training import interval
from dpteach.training.checkpoint import latest_checkpoint
from dpteach.training.reference import exact_tolerance
from dpteach.training.resumable import Checkpointing, check_run, train_resumable_on_rank
from dpteach.training.train import TrainConfig


def test_a_fault_is_written_kind_at_step_colon_rank_and_checked_against_the_world():
    assert Fault.parse("kill@6:1") == Fault("kill", rank=1, step=6)
    assert Fault.parse("hang@3") == Fault("hang", rank=1, step=3)
    for text in ("kill", "kill@x", "kill@3:y"):
        with pytest.raises(ValueError, match="KIND@STEP"):
            Fault.parse(text)
    with pytest.raises(ValueError, match="fault kind"):
        Fault("explode", 1, 3).check(2, 10)
    with pytest.raises(ValueError, match="fault rank"):
        Fault("kill", rank=2, step=3).check(2, 10)
    with pytest.raises(ValueError, match="fault step"):
        Fault("kill", rank=1, step=10).check(2, 10)


def test_bad_checkpoint_runs_are_refused_before_any_rank_starts(tmp_path):
    config = TrainConfig(strategy="ddp", steps=4)
    with pytest.raises(ValueError, match="strategy='int8_ef'.*checkpoints"):
        check_run(TrainConfig(strategy="int8_ef", steps=4), Checkpointing(str(tmp_path)), None, 2)
    with pytest.raises(ValueError, match="leave_out"):
        check_run(config, Checkpointing(str(tmp_path), leave_out=("weights",)), None, 2)
    with pytest.raises(ValueError, match="every"):
        check_run(config, Checkpointing(str(tmp_path), every=0), None, 2)
    with pytest.raises(ValueError, match="input_noise"):
        TrainConfig(model="transformer", input_noise=0.1).check(2)
    with pytest.raises(ValueError, match="resume_world_size=3"):
        resume_equivalence(resume_world_size=3)  # 64 samples do not split over 3 ranks
    with pytest.raises(ValueError, match="kill_after=40"):
        replica_groups(steps=40, kill_after=40)  # refused before a lighthouse or a group starts


def test_the_command_refuses_a_bad_fault_with_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "dpteach", "train", "--checkpoint", str(tmp_path), "-w", "2",
                           "--fault", "explode@3:1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "fault kind='explode'" in done.stderr, done.stderr
    assert not list(tmp_path.iterdir())  # nothing started, nothing written


def test_a_checkpoint_still_being_written_is_not_a_checkpoint(tmp_path):
    (tmp_path / "step-000004").mkdir()
    (tmp_path / "step-000008.partial").mkdir()  # a rank died while writing it
    assert latest_checkpoint(tmp_path) == (4, tmp_path / "step-000004")
    assert latest_checkpoint(tmp_path / "nothing-here") is None


def test_the_interval_formulas_match_a_simulated_job():
    mtbf = interval.job_mtbf_s(8000, 60_000)  # 7.5 hours
    young, daly = interval.young_interval(60, mtbf), interval.daly_interval(60, mtbf)
    assert young == pytest.approx(1800) and daly < young
    assert interval.daly_interval(100, 40) == 40  # a checkpoint longer than 2M: Daly's rule gives M
    for tau in (young / 4, young, young * 4):
        simulated = interval.simulate_fraction_lost(tau, 60, 300, mtbf, failures=2000)["fraction_lost"]
        assert simulated == pytest.approx(interval.expected_fraction_lost(tau, 60, 300, mtbf), abs=0.01)
    result = checkpoint_interval(gpus=8000, gpu_mtbf_hours=60_000, checkpoint_s=60, restart_s=300)
    assert result["young_s"] == pytest.approx(1800)
    assert result["lost_at_young"] <= min(row["expected"] for row in result["rows"]) + 1e-3


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("fresh_workers", [False, True])
def test_torchrun_restarts_a_killed_rank_and_the_job_ends_bit_for_bit_equal(fresh_workers):
    result = restart_run(strategy="ddp", world_size=2, steps=10, every=3, fault_step=5, max_restarts=1,
                         fresh_workers=fresh_workers)
    assert result["fresh_workers"] is fresh_workers and result["restarts"] == 1
    assert result["resumed_from"] == 3 and result["steps_redone"] == 2
    assert result["max_abs_diff"] == 0.0


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("strategy,resume_at", [("zero2", 4), ("fsdp", 1)])
def test_a_sharded_run_killed_on_2_ranks_resumes_on_another_number_of_ranks(tmp_path, strategy, resume_at):
    def run(world):  # the global batch stays 64 samples whatever W
        return TrainConfig(strategy=strategy, steps=8, batch_per_rank=64 // world, optimizer="adam")
    untouched = launch(train_resumable_on_rank, 2, args=(run(2), Checkpointing(str(tmp_path / "a"), every=8)),
                       show_output=False, progress=False)[0]
    with pytest.raises(RankError, match="rank 1 killed by SIGKILL"):
        launch(train_resumable_on_rank, 2, args=(run(2), Checkpointing(str(tmp_path / "b"), every=2),
                                                 Fault("kill", rank=1, step=5)), show_output=False, progress=False)
    assert latest_checkpoint(tmp_path / "b")[0] == 4
    resumed = launch(train_resumable_on_rank, resume_at, args=(run(resume_at), Checkpointing(str(tmp_path / "b"),
                                                                                              every=2)),
                     show_output=False, progress=False)
    first = resumed[0]
    assert first["resumed_from"] == 4 and first["saved_world_size"] == 2
    assert all(rank["replica_spread"] == 0.0 for rank in resumed)
    gap = (first["params"] - untouched["params"]).abs().max().item()
    assert 0 <= gap <= exact_tolerance(run(2)), gap


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_whole_resume_is_exact_and_each_piece_left_out_shows():
    result = resume_equivalence(strategy="ddp", world_size=2, steps=10, stop_at=5)
    runs = result["runs"]
    assert runs["resumed"]["max_abs_diff"] == 0.0 and runs["resumed"]["resumed_from"] == 5
    for piece in ("optimizer", "rng", "data", "scaler"):
        assert runs[f"without {piece}"]["max_abs_diff"] > 0, piece
        assert piece not in runs[f"without {piece}"]["restored"]


def test_faults_are_chosen_by_the_names_the_table_gives_them():
    assert FAULT_NAMES == ("raise", "kill", "hang", "hang + DETAIL", "mismatch + DETAIL")
    assert fault_row("hang + DETAIL") == ("hang", True) and fault_row("kill") == ("kill", False)
    for faults in (["explode"], [], ["mismatch"]):  # refused before any torchrun starts
        with pytest.raises(ValueError, match="faults"):
            fault_detection(faults=faults)
    with pytest.raises(ValueError, match="parallel=0"):
        fault_detection(faults=["kill"], parallel=0)
    with pytest.raises(ValueError, match="rounds=4"):
        checkpoint_cost(rounds=4)  # too few for an interval of the median


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_dead_peer_is_seen_at_once_and_a_hung_one_at_the_timeout_jobs_side_by_side():
    result = fault_detection(faults=["hang + DETAIL", "kill"], timeout_s=2.0, parallel=2)
    hang, kill = result["rows"]  # in the order asked, whichever job ended first
    assert (hang["kind"], hang["debug_detail"], kill["kind"]) == ("hang", True, "kill")
    assert kill["every_peer_knew"] and kill["peers_knew_after_s"] < 2.0
    assert hang["every_peer_knew"] and hang["peers_knew_after_s"] >= 1.8
    peer = next(r for r in hang["ranks"] if not r["faulty"])
    assert "monitoredBarrier" in peer["error"] and "1" in peer["error"]
    assert all(row["torchrun_exit_code"] != 0 for row in result["rows"])
    assert "exitcode : -9" in " ".join(kill["torchrun_said"])  # the forked worker's SIGKILL, as torchrun saw it


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_raise_is_a_death_and_a_mismatch_is_named_under_detail():
    raised, mismatch = fault_detection(faults=["raise", "mismatch + DETAIL"], timeout_s=3.0)["rows"]
    assert raised["every_peer_knew"] and raised["peers_knew_after_s"] < 3.0
    assert "mismatch" in " ".join(r["error"] or "" for r in mismatch["ranks"])
    assert "BROADCAST" in " ".join(r["error"] or "" for r in mismatch["ranks"])  # rank 1's wrong call, named


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_checkpoint_costs_are_interleaved_rounds_with_every_rank_writing_its_share():
    result = checkpoint_cost(strategies=("ddp", "zero2"), world_size=2, rounds=5)
    for row in result["rows"]:
        for name in ("sync_s", "async_blocked_s", "async_total_s"):
            spread = row["spreads"][name]
            assert spread["n"] == 5 and spread["low"] <= spread["median"] == row[name] <= spread["high"]
        assert all(blocked <= total for blocked, total in zip(row["spreads"]["async_blocked_s"]["samples"],
                                                             sorted(row["spreads"]["async_total_s"]["samples"])))
        assert all(b > 0 for b in row["rank_bytes"]) and sum(row["rank_bytes"]) <= row["total_bytes"]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(torchft_missing() is not None, reason="torchft has wheels for Linux on x86-64 only")
def test_a_spare_replica_group_joins_at_the_jobs_step_and_ends_equal():
    result = replica_groups()
    assert result["logs"]["group0"][-1]["step"] == result["steps"] - 1
    assert result["replacement_joined_at_step"] is not None
    assert result["kill_after"] < result["replacement_joined_at_step"] < result["steps"]
    assert result["max_abs_diff"] == 0.0
