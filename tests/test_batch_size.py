"""Lesson 15's batch-size library: the learning-rate rules, the noise-scale estimator held to a distribution whose
gradient and noise are known, the steps fit, and the runs on real ranks held to one process (W ranks x micro-batches
x accumulation is one global batch), then the issue's measured bars."""
import math

import pytest
import torch

from dpteach.experiments.batch_size import critical_batch, lr_rules, split, time_to_target_scaling
from dpteach.training.batch_rules import NoiseScale, fit_steps, lr_at, noise_scale_terms, run_outcome, scaled_lr


def test_the_rules_scale_the_base_rate_by_k_by_its_root_or_not_at_all_and_warmup_ramps_to_it():
    assert scaled_lr("fixed", 0.1, 32, 512) == 0.1
    assert scaled_lr("linear", 0.1, 32, 512) == pytest.approx(1.6)
    assert scaled_lr("sqrt", 0.1, 32, 512) == pytest.approx(0.4)
    assert scaled_lr("linear", 0.1, 256, 32) == pytest.approx(0.0125)  # a smaller batch scales down
    assert [lr_at(s, 1.0, 0.2, 4) for s in range(6)] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0, 1.0])
    assert lr_at(0, 1.0, 0.2, 0) == 1.0
    assert run_outcome({"steps_to_target": 31, "diverged_at": None, "stopped_at": None}) == "31 steps"
    assert run_outcome({"steps_to_target": None, "diverged_at": 18, "stopped_at": None}) == "diverged at step 18"
    assert run_outcome({"steps_to_target": None, "diverged_at": None, "stopped_at": 60}) == "not in 60 steps"
    with pytest.raises(ValueError, match="rule='cubic'"):
        scaled_lr("cubic", 0.1, 32, 64)
    with pytest.raises(ValueError, match="base_lr"):
        scaled_lr("linear", -0.1, 32, 64)


def test_the_two_batch_estimator_recovers_a_known_gradient_and_noise_and_their_ratio():
    """Per-sample gradients drawn around G with covariance diag(s^2): |G|^2 and tr(Sigma) are known, so B_simple is."""
    gen = torch.Generator().manual_seed(0)
    dim, small, big = 50, 8, 64
    true_g = torch.randn(dim, generator=gen) * 0.3
    scale = torch.rand(dim, generator=gen) + 0.5
    noise = NoiseScale()
    for _ in range(3000):
        samples = true_g + scale * torch.randn(big, dim, generator=gen)
        noise.add(samples[:small].mean(0).pow(2).sum().item(), samples.mean(0).pow(2).sum().item(), small, big)
    want_g2, want_trace = true_g.pow(2).sum().item(), scale.pow(2).sum().item()
    got = noise.as_dict()
    assert got["grad_sq"] == pytest.approx(want_g2, rel=0.1)
    assert got["trace_sigma"] == pytest.approx(want_trace, rel=0.05)
    assert noise.value == pytest.approx(want_trace / want_g2, rel=0.12)
    with pytest.raises(ValueError, match="b_small=64"):
        noise_scale_terms(1.0, 1.0, 64, 8)


def test_the_fit_recovers_s_min_and_b_noise_from_steps_that_follow_the_relation():
    batches = [32, 64, 128, 256, 512]
    fit = fit_steps(batches, [20 * (1 + 100 / b) for b in batches])
    assert fit["s_min"] == pytest.approx(20) and fit["b_noise"] == pytest.approx(100)
    assert fit["e_min"] == pytest.approx(2000) and fit["worst_error"] == pytest.approx(0, abs=1e-9)
    assert fit_steps([32, 64, 128], [50, None, 20])["batches"] == [32, 128]  # a batch that missed is left out
    with pytest.raises(ValueError, match="two or more different batches"):
        fit_steps([32, 64], [40, None])


def test_a_global_batch_is_split_into_ranks_micro_batches_and_accumulation():
    assert split(32, 2) == (16, 1)
    assert split(4096, 2) == (256, 8)
    assert split(96, 4) == (24, 1)
    with pytest.raises(ValueError, match="batch=33 is not allowed on 2 ranks"):
        split(33, 2)


def test_bad_arguments_are_refused_before_any_rank_starts():
    with pytest.raises(ValueError, match="batches=33"):
        critical_batch(batches=(32, 33))
    with pytest.raises(ValueError, match="rules"):
        lr_rules(rules=("fixed", "cubic"))
    with pytest.raises(ValueError, match="world_size"):
        critical_batch(world_size=1)
    with pytest.raises(ValueError, match="model='cnn'"):
        time_to_target_scaling({"model": "cnn", "scaling": "weak", "rows": []})


@pytest.mark.slow  # more than 4 s on 2 cores: in `make test`, not `make test-fast`
def test_two_ranks_with_accumulation_train_exactly_as_one_process_on_the_same_global_batch():
    """The same global batch of 1024, as 1 x 256 x 4 and as 2 x 256 x 2: every loss agrees to float rounding."""
    kw = dict(batches=(1024,), rules=("linear",), warmup_steps=3, max_steps=8, target_loss=1e-3, base_batch=1024,
              base_lr=0.05)
    one, two = lr_rules(world_size=1, **kw)["rows"], lr_rules(world_size=2, **kw)["rows"]
    assert (one[0]["accum_steps"], two[0]["accum_steps"]) == (4, 2)
    assert len(one[0]["losses"]) == len(two[0]["losses"]) == 8
    assert one[0]["losses"] == pytest.approx(two[0]["losses"], rel=1e-5)
    assert one[0]["losses"][-1] < one[0]["losses"][0]


@pytest.mark.slow
def test_the_issue_bars_the_fit_is_within_a_quarter_and_linear_with_warmup_beats_a_fixed_rate():
    """The measured bars, on the lesson's defaults: every batch (32 to 256) reaches the target, the fit of
    S = S_min (1 + B_noise / B) predicts every one within 25%, the ranks' gradients give a noise scale; at the
    largest batch, linear scaling with warmup takes fewer steps than the fixed rate."""
    result = critical_batch()
    reached = [r for r in result["rows"] if r["steps_to_target"]]
    assert len(reached) == len(result["rows"]) >= 4
    assert result["fit"]["worst_error"] <= 0.25, result["fit"]
    b_simple = result["noise_scale"]["b_simple"]
    assert b_simple is not None and math.isfinite(b_simple) and b_simple > 0
    steps = [r["steps_to_target"] for r in reached]
    assert steps[0] > steps[-1]  # more samples per step do save steps at first
    rules = lr_rules(batches=(1024,), rules=("fixed", "linear"))
    assert rules["largest"]["linear_warmup_beats_fixed"], rules["rows"]


def test_the_command_refuses_a_batch_the_ranks_cannot_split_with_one_clear_line():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "dpteach.cli", "batch-size", "--batches", "32,33"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "batches=33 is not allowed on 2 ranks" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_time_to_target_efficiency_is_the_step_time_efficiency_times_a_counted_factor():
    """From given runs (no ranks): time to target at W over W times the time at 1 is the samples-per-second
    efficiency times steps(1) / (W steps(W)), and the efficiency's interval carries over by the same factor."""
    scaling = {"model": "mlp", "scaling": "weak", "rows": [
        {"world_size": 1, "batch_per_rank": 32, "step_time_s": 0.010, "efficiency": 1.0,
         "efficiency_interval": (1.0, 1.0)},
        {"world_size": 2, "batch_per_rank": 32, "step_time_s": 0.0125, "efficiency": 0.8,
         "efficiency_interval": (0.7, 0.9)}]}
    critical = {"rows": [{"batch": 32, "steps_to_target": 40}, {"batch": 64, "steps_to_target": 25}],
                "target_loss": 1.0, "b_crit": 60.0}
    rows = time_to_target_scaling(scaling, critical)["rows"]
    assert rows[0]["efficiency_to_target"] == pytest.approx(1.0) and rows[0]["steps_factor"] == pytest.approx(1.0)
    assert rows[1]["steps_factor"] == pytest.approx(40 / (2 * 25))
    assert rows[1]["efficiency_to_target"] == pytest.approx(0.010 * 40 / (2 * 0.0125 * 25))
    assert rows[1]["efficiency_to_target"] == pytest.approx(0.8 * rows[1]["steps_factor"])
    assert rows[1]["efficiency_to_target_interval"] == pytest.approx((0.7 * 0.8, 0.9 * 0.8))


def test_the_critical_batch_plot_labels_every_measured_batch_and_several_steps_and_names_s_min():
    """Readable log axes at both of the lesson's targets: each measured batch a tick label, at least two labels
    on each y axis, and the S_min line in the legend."""
    import matplotlib
    matplotlib.use("Agg")
    from dpteach.widgets.batch_size import plot_critical_batch
    for steps in ((93, 49, 40, 27, 24), (37, 32, 23, 18, 18)):
        batches = (32, 64, 128, 256, 512)
        rows = [{"batch": b, "steps_to_target": s, "samples_to_target": b * s} for b, s in zip(batches, steps)]
        fit = fit_steps(batches, steps)
        fig = plot_critical_batch({"rows": rows, "fit": fit, "noise_scale": {"b_simple": 110.0}})
        fig.canvas.draw()
        for ax in fig.axes:
            assert [t.get_text() for t in ax.get_xticklabels()] == [str(b) for b in batches]
            labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
            assert len(labels) >= 2, labels
        assert any(text.startswith("S_min") for text in fig.axes[0].get_legend_handles_labels()[1])
        import matplotlib.pyplot as plt
        plt.close(fig)
