"""Lesson 09: the scaling sweep on real ranks, and the simulator's arithmetic."""
import pytest

from dpteach.network import scaling
from dpteach.network import PRESETS, Link
from dpteach.experiments import scaling_simulation, scaling_sweep

LAPTOP = Link("laptop", alpha_s=1e-3, beta_s_per_byte=1e-9)


def test_simulator_efficiency_falls_as_w_grows_and_comm_rises():
    rows = scaling.simulate(scaling.powers_of_two(4096), 0.1, 100e6, PRESETS["ib_8nics"], overlap=0.5)
    assert rows[0]["efficiency"] == 1.0 and rows[0]["comm_s"] == 0.0
    effs, comms = [r["efficiency"] for r in rows], [r["comm_s"] for r in rows]
    assert effs == sorted(effs, reverse=True) and comms == sorted(comms)
    assert all(0 < e <= 1 for e in effs)
    for r in rows:
        assert r["step_s"] == pytest.approx(r["compute_s"] + r["exposed_s"])
        assert r["speedup"] == pytest.approx(r["world_size"] * r["efficiency"])


def test_overlap_hides_communication_up_to_the_compute_time():
    hidden = scaling.predict_step(8, 1.0, 1e6, LAPTOP, overlap=1.0)
    assert hidden["comm_s"] < 1.0 and hidden["exposed_s"] == 0.0 and hidden["efficiency"] == 1.0
    bare = scaling.predict_step(8, 1.0, 1e6, LAPTOP, overlap=0.0)
    assert bare["exposed_s"] == pytest.approx(bare["comm_s"]) and bare["efficiency"] < 1.0


def test_auto_picks_the_faster_algorithm_and_buckets_pay_latency():
    for w in (4, 64, 4096):
        ring = scaling.predict_step(w, 0.1, 1e5, LAPTOP, algorithm="ring")["comm_s"]
        tree = scaling.predict_step(w, 0.1, 1e5, LAPTOP, algorithm="tree")["comm_s"]
        auto = scaling.predict_step(w, 0.1, 1e5, LAPTOP, algorithm="auto")["comm_s"]
        assert auto == pytest.approx(min(ring, tree))
    one = scaling.predict_step(16, 0.1, 8e6, LAPTOP)
    many = scaling.predict_step(16, 0.1, 8e6, LAPTOP, bucket_bytes=1e6)
    assert many["messages"] == 8 and many["comm_s"] > one["comm_s"]


def test_simulation_experiment_returns_one_curve_per_link():
    result = scaling_simulation(max_world_size=64, measured_link={"alpha_s": 1e-3, "beta_s_per_byte": 1e-9})
    assert len(result["curves"]) == 3 and result["names"] == ["this machine", "nvlink", "ib_8nics"]
    assert all([r["world_size"] for r in rows] == [1, 2, 4, 8, 16, 32, 64] for rows in result["curves"].values())
    with pytest.raises(ValueError, match="links"):
        scaling_simulation(links=("ethernet",))
    with pytest.raises(ValueError, match="overlap"):
        scaling.predict_step(2, 0.1, 1e6, LAPTOP, overlap=1.5)


@pytest.mark.slow
def test_a_measured_link_whose_fit_found_no_slope_is_simulated_by_its_latency_alone():
    # non-negative least squares gives beta = 0 when noise hides the slope (a busy machine); the lesson's
    # cell below the sweep must still draw it
    result = scaling_simulation(max_world_size=8, links=(), measured_link={"alpha_s": 1e-4, "beta_s_per_byte": 0.0})
    [(label, rows)] = result["curves"].items()
    assert "inf GB/s" in label
    by_w = {row["world_size"]: row for row in rows}
    assert by_w[8]["comm_s"] == pytest.approx(by_w[8]["messages"] * 2 * 7 * 1e-4)  # a ring's 2(W-1) latencies per
    assert by_w[1]["comm_s"] == 0.0                                                  # message, nothing for bytes


@pytest.mark.slow  # more than 4 s on 2 cores: in `make test`, not `make test-fast`
def test_sweep_reports_throughput_efficiency_and_breakdown():
    result = scaling_sweep(world_sizes=(1, 2), model="mlp", steps=4, repeats=1, batch_per_rank=8)
    rows = result["rows"]
    assert [r["world_size"] for r in rows] == [1, 2]
    assert rows[0]["efficiency"] == pytest.approx(1.0) and rows[0]["speedup"] == pytest.approx(1.0)
    for r in rows:
        assert r["samples_per_s"] == pytest.approx(r["world_size"] * 8 / r["step_time_s"])
        assert r["efficiency"] == pytest.approx(r["samples_per_s"] / (r["world_size"] * rows[0]["samples_per_s"]))
        assert set(r["breakdown"]) == {"forward", "backward", "optimizer", "wait", "data_and_other", "comm_busy",
                                       "exposed"}
        assert r["exposed_comm_s"] == r["breakdown"]["exposed"] <= r["step_time_s"]  # measured, where it waited
        assert r["oversubscribed"] == (r["world_size"] > result["cpus"])
        assert r["hidden_comm_s"] == pytest.approx(max(0.0, r["breakdown"]["comm_busy"] - r["exposed_comm_s"]))
        assert 0.0 <= r["overlap_fraction"] <= 1.0
    assert result["link"]["world_size"] == 2 and result["link"]["alpha_s"] >= 0
    assert result["grad_bytes"] == 4 * 1089034 and result["compute_s"] > 0


@pytest.mark.slow
def test_strong_scaling_shares_one_global_batch():
    result = scaling_sweep(world_sizes=(1, 2), model="mlp", steps=4, repeats=1, batch_per_rank=8, scaling="strong",
                           backend="gloo", device="cpu")
    assert result["scaling"] == "strong" and result["global_batch"] == 16
    assert [(r["world_size"], r["batch_per_rank"]) for r in result["rows"]] == [(1, 16), (2, 8)]
    for r in result["rows"]:
        assert r["samples_per_s"] == pytest.approx(16 / r["step_time_s"])


@pytest.mark.slow
def test_a_sweep_on_an_emulated_link_reports_who_set_the_time():
    result = scaling_sweep(world_sizes=(1, 2), model="mlp", steps=4, repeats=1, batch_per_rank=8,
                           link={"alpha_s": 2e-3, "beta_s_per_byte": 1e-9}, backend="gloo", device="cpu")
    assert result["emulated_link"]["alpha_s"] == 2e-3
    assert result["rows"][1]["time_set_by"] in ("link", "machine")


@pytest.mark.parametrize("kwargs, word", [({"world_sizes": (2, 4)}, "world_sizes"), ({"strategy": "async"}, "strategy"),
                                          ({"repeats": 0}, "repeats"), ({"threads_per_rank": 0}, "threads_per_rank"),
                                          ({"scaling": "both"}, "scaling='both'"),
                                          ({"scaling": "strong", "global_batch": 6, "world_sizes": (1, 4)},
                                           "global_batch=6"),
                                          ({"link": "5gbe"}, "link='5gbe'")])
def test_bad_sweep_arguments_fail_before_any_rank_starts(kwargs, word):
    with pytest.raises(ValueError, match=word):
        scaling_sweep(**kwargs)


@pytest.mark.slow  # more than 4 s on 2 cores: in `make test`, not `make test-fast`
def test_a_weak_sweep_measures_strong_scaling_in_the_same_worlds_and_the_strong_panel_reuses_it():
    """strong_too: one launch per W runs both, and the two-rank world searches the steps to a target too; at the largest W the two configs are one run; every efficiency
    carries the interval its two step times allow, and the strong panel takes the companion when model and link
    match."""
    from dpteach.experiments.scaling import strong_scaling
    from dpteach.experiments.batch_size import time_to_target_scaling
    weak = scaling_sweep(world_sizes=(1, 2), model="mlp", steps=5, repeats=1, batch_per_rank=8, strong_too=True,
                         to_target=2.25, target_max_steps=12, backend="gloo", device="cpu")
    searched = weak["critical"]  # the steps to target, searched in the sweep's two-rank world
    assert [r["batch"] for r in searched["rows"]] == [8, 16] and searched["target_loss"] == 2.25
    assert time_to_target_scaling(weak, target_loss=2.25, max_steps=12)["critical"] is searched  # no new world
    strong = weak["strong"]
    assert strong["scaling"] == "strong" and strong["global_batch"] == 16 and strong["measured_with"] == "weak"
    assert [(r["world_size"], r["batch_per_rank"]) for r in strong["rows"]] == [(1, 16), (2, 8)]
    assert strong["rows"][-1]["step"] == weak["rows"][-1]["step"]  # the same config at the largest W ran once
    for result in (weak, strong):
        assert result["rows"][0]["efficiency_interval"] == (1.0, 1.0)
        for r in result["rows"]:
            assert len(r["step"]["samples"]) == 5 - 2  # the timed steps of the one pass, warm-up left out
            assert r["step"]["low"] <= r["step_time_s"] == r["step"]["median"] <= r["step"]["high"]
            low, high = r["efficiency_interval"]
            assert low <= r["efficiency"] <= high
        names = {f"W={r['world_size']}" for r in result["rows"]}
        assert set(result["throughput"]["order"]) == names and result["throughput"]["sentence"]
    assert strong_scaling(weak, model="mlp", link=None) is strong
    assert strong_scaling(weak, model="mlp", link=None, steps=5) is strong


def test_without_a_companion_the_strong_panel_refuses_bad_input_before_any_rank_starts():
    from dpteach.experiments.scaling import strong_scaling
    weak = {"world_sizes": [1, 2], "model": "mlp", "strategy": "overlap", "batch_per_rank": 8, "steps": 4,
            "emulated_link": None, "peers": "real"}
    with pytest.raises(ValueError, match="link='5gbe'"):
        strong_scaling(weak, model="mlp", link="5gbe")
