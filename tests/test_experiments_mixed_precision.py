"""Lesson 12's experiments on a real gloo world: what they report is what the runs did."""
import math

import pytest

from dpteach.experiments import comm_precision, loss_scaling, precision_drift


@pytest.fixture(scope="module")
def drift():
    return precision_drift(2, steps=4, batch_per_rank=16)


def test_precision_drift_keeps_fp32_state_and_halves_saved_activations(drift):
    rows = {r["precision"]: r for r in drift["rows"]}
    assert list(rows) == ["fp32", "bf16", "fp16"]
    assert drift["fp32_vs_single"] <= drift["tolerance"]
    assert rows["fp32"]["relative_drift"] == 0.0 and rows["fp32"]["max_abs_diff_vs_fp32"] == 0.0
    assert len({r["state_bytes"] for r in rows.values()}) == 1  # autocast leaves parameters, grads, state in fp32
    for name in ("bf16", "fp16"):
        assert rows[name]["saved_activation_bytes"] == pytest.approx(rows["fp32"]["saved_activation_bytes"] / 2, rel=0.1)
        assert rows[name]["saved_weight_copy_bytes"] > 0 and rows[name]["relative_drift"] > 0
        assert rows[name]["replicas_identical"]
    assert rows["fp32"]["saved_weight_copy_bytes"] == 0
    for row in rows.values():  # the timed steps, taken in turn by the three runs: the lesson's intervals
        d = row["spread"]["step_s"]
        assert d["n"] == 4 - 2 and d["low"] <= d["median"] <= d["high"]


@pytest.mark.slow  # more than 4 s on 2 cores: in `make test`, not `make test-fast`
def test_loss_scaling_skips_halve_the_scale_and_the_mistake_stalls_training():
    result = loss_scaling(2, steps=12, init_scale=2.0**22, growth_interval=3)
    right = result["runs"]["fp16, unscaled then clipped"]
    wrong = result["runs"]["fp16, clipped while scaled"]
    assert right["skipped"][0] and not all(right["skipped"])
    assert right["scales"][0] == 2.0**22 and len(right["scales"]) == 12
    for now, after, skip in zip(right["scales"], right["scales"][1:], right["skipped"]):
        assert after == now / 2 if skip else after in (now, now * 2)
    assert all(math.isnan(n) or math.isinf(n) for n, skip in zip(right["grad_norms"], right["skipped"]) if skip)
    assert wrong["moved"] < 0.01 * right["moved"]
    assert result["runs"]["fp32, clipped"]["scales"] == [] and right["replicas_identical"]


def test_comm_precision_halves_the_bytes_and_drifts():
    rows = {r["grad_comm"]: r for r in comm_precision(2, steps=3)["rows"]}
    assert rows["fp32"]["bytes_vs_fp32"] == 1.0
    assert rows["bf16"]["bytes_vs_fp32"] == rows["fp16"]["bytes_vs_fp32"] == 0.5
    assert rows["bf16"]["max_abs_diff_vs_fp32"] > 0 and all(r["replicas_identical"] for r in rows.values())


@pytest.mark.parametrize("call, named", [
    (lambda: precision_drift(2, model="resnet"), "model"),
    (lambda: precision_drift(2, steps=1), "steps"),
    (lambda: loss_scaling(2, init_scale=0), "init_scale"),
    (lambda: loss_scaling(2, growth_interval=0), "growth_interval"),
    (lambda: comm_precision(1), "world_size"),
])
def test_bad_arguments_are_refused_before_any_rank_starts(call, named):
    with pytest.raises(ValueError, match=named):
        call()
