"""Lesson 15: how big a batch - the learning-rate rules and the critical batch size, measured on real ranks.

The runs themselves - the MLP trained to a target loss at a global batch of W ranks x K micro-batches, with the
noise scale from the same all-reduce - are in ``batch_runs.py``, which lesson 09 uses too. Here:

* :func:`lr_rules`: one base learning rate, scaled to larger batches as ``fixed``, ``linear`` or
  ``sqrt``, each with and without warmup; loss against steps and against samples.
* :func:`critical_batch`: at each global batch, the steps to a target loss with the best learning rate of
  a small grid, the fit ``S = S_min (1 + B_noise / B)``, and the simple noise scale from the ranks' own
  gradients.
* :func:`time_to_target_scaling`: lesson 09's weak-scaling step times turned into time to a target loss.

A loss "reaches" the target when its running mean over the last ``WINDOW`` steps does
(``training/target.py``), the rule of lesson 14.
"""
from __future__ import annotations

from .. import validate
from ..ranks.launcher import launch
from ..ranks.world import World, resolve_world
from ..training.batch_rules import LR_RULES, scaled_lr
from ..training.target import WINDOW
from .batch_runs import MODEL, MOMENTUM, critical_result, runs_on_rank, search_on_rank, split

TARGET_LOSS = 0.7  # about 30% of the first loss, ln(10) = 2.30: far enough for the noise scale to have grown
# The learning-rate rules and lesson 09's time to target compare runs, not the last stretch of one: to 1.0 every
# batch from 32 to 512 arrives in 20 to 40 steps at a good rate, to 0.7 batch 32 needs over 90 (the critical-batch
# table shows both). Half the steps for the same comparison.
QUICK_TARGET = 1.0
EDGE_LR = 0.16  # the largest rate of LR_GRID that trained this MLP at any batch (critical_batch's runs)


def _check_batches(name: str, batches, world_size: int) -> list[int]:
    batches = list(batches)
    if not batches:
        raise ValueError(f"{name}=[] is not allowed: give at least one global batch")
    for b in batches:
        validate.integer(name, b, low=1)
        split(b, world_size, name)
    return batches


def critical_batch(batches=(32, 64, 128, 256), world_size: int | World = 2,
                   target_loss: float = TARGET_LOSS, max_steps: int = 200, start_lr: float = 0.01,
                   backend: str = "auto", timeout: float = 300.0) -> dict:
    """Steps and samples to ``target_loss`` at each global batch (its best learning rate from ``LR_GRID``), the
    fit ``S = S_min (1 + B_noise / B)``, and the simple noise scale measured from the ranks' gradients.

    The default batches stop at 256: at ``TARGET_LOSS`` the fit puts ``B_noise`` near 120, so 256 is past the
    bend, and the search at 512 would cost as much as the four smaller batches together (twice the samples per
    step) to show the flat part once more (24 steps at 512 and at 1024 in the run of
    ``benchmarks/results/critical_batch_mlp_w2.json``). Rank 0 announces the bar before the first run and
    advances it per batch.

    Returns ``{"model", "world_size", "target_loss", "window", "rows": [{"batch", "micro_batch", "accum_steps",
    "best_lr", "steps_to_target", "samples_to_target", "losses", "noise", "tried"}], "fit" (see
    ``batch_rules.fit_steps``; None with fewer than two batches that reached the target), "noise_scale"
    (B_simple from all the best runs' steps together: {"b_simple", "grad_sq", "trace_sigma", "steps"}),
    "b_crit" (the fit's E_min / S_min, which equals its B_noise)}``.
    """
    world = resolve_world(world_size, backend=backend)
    validate.ranks(world, 2, "the noise scale needs two batch sizes: a rank's own and the all-reduced")
    batches = sorted(_check_batches("batches", batches, world.size))
    validate.number("target_loss", target_loss, above=0)
    validate.integer("max_steps", max_steps, low=WINDOW)
    validate.number("start_lr", start_lr, above=0)
    validate.number("timeout", timeout, above=0, unit="a number of seconds")
    rows = launch(search_on_rank, world, args=(batches, target_loss, max_steps, start_lr), timeout=timeout,
                  show_output=False)[0]
    return critical_result(rows, world.size, target_loss, max_steps)


def lr_rules(batches=(32, 256), world_size: int | World = 2, base_lr: float | None = None, base_batch: int = 32,
             rules=LR_RULES, warmup_steps: int = 10, target_loss: float = QUICK_TARGET, max_steps: int = 60,
             backend: str = "auto", timeout: float = 300.0) -> dict:
    """The same model at each global batch with ``base_lr`` (good at ``base_batch``) scaled by each rule, with and
    without ``warmup_steps`` of linear warmup; every run stops at ``target_loss`` or after ``max_steps``.

    ``base_lr=None`` chooses the base so that the linear rule asks, at the largest batch, for half of ``EDGE_LR``
    (0.16, the largest rate of ``LR_GRID`` that trained this MLP at any batch in ``critical_batch``:
    ``benchmarks/results/critical_batch_mlp_w2.json``). The experiment asks whether the rules keep a run stable and
    fast as the batch grows from a base that the largest batch can take, as Goyal et al.'s base (0.1 per 256 images)
    could be taken to 8k. At the edge itself a run's fate is chance: with the base giving 0.16 at 4096, one run
    without warmup arrived in 23 steps while one with warmup spiked past ``DIVERGED`` (that run is in the git
    history of ``benchmarks/results/lr_rules_mlp_w2.json``). The rate that is best at 32 alone (0.01 to 0.02) scaled
    by 32 or more is far past the edge: the linear rule's premise, that k steps' worth of gradient can be taken in
    one, holds only while the larger step stays stable (Goyal et al. section 2.1), which a learner sees by choosing
    it. Warmup changes nothing when the rate does not change (``fixed``), so ``fixed`` runs once.

    The defaults are the smallest run that shows every point: batches 32 and 256 (k = 8) to ``QUICK_TARGET``
    (1.0), where the auto base is 0.01, close to the best rate of batch 32 alone, so every run of every rule
    arrives within ``max_steps`` and the samples each batch needed can be compared. A batch between them adds a
    trend and five runs; a larger one (512, 1024) shows the same at several times the cost per step; to
    ``TARGET_LOSS`` batch 32 alone needs over 90 steps.

    Returns ``{"rows": [{"batch", "rule", "warmup_steps", "lr", "losses", "lrs", "steps_to_target",
    "samples_to_target", "diverged_at", "stopped_at", "micro_batch", "accum_steps"}], "largest": {"batch",
    "fewest" (rule and warmup of the fewest steps), "linear_warmup_vs_fixed" (steps ratio, None where either
    missed)}, ...}``. At ``base_batch`` the rules agree, so it is run once.
    """
    world = resolve_world(world_size, backend=backend)
    batches = sorted(_check_batches("batches", batches, world.size))
    for rule in rules:
        validate.choice("rules", rule, LR_RULES)
    validate.optional(validate.number, "base_lr", base_lr, above=0)
    validate.integer("base_batch", base_batch, low=1)
    validate.integer("warmup_steps", warmup_steps, low=0)
    if base_lr is None:
        base_lr = EDGE_LR / 2 / (max(batches) / base_batch)
    validate.number("target_loss", target_loss, above=0)
    validate.integer("max_steps", max_steps, low=WINDOW)
    runs = []
    for batch in batches:
        combos = [("fixed", 0)] if batch == base_batch else [
            (r, 0 if r == "fixed" else w) for r in rules for w in (0, warmup_steps)]
        for rule, warm in dict.fromkeys(combos):
            runs.append({"batch": batch, "rule": rule, "warmup_steps": warm, "base_lr": base_lr,
                         "lr": scaled_lr(rule, base_lr, base_batch, batch), "max_steps": max_steps,
                         "target": target_loss})
    rows = launch(runs_on_rank, world, args=(runs,), timeout=timeout, show_output=False)[0]
    for row in rows:
        row.pop("noise")
    largest = max(batches)
    at_largest = {(r["rule"], r["warmup_steps"]): r for r in rows if r["batch"] == largest}
    done = [r for r in at_largest.values() if r["steps_to_target"]]
    fewest = min(done, key=lambda r: r["steps_to_target"]) if done else None
    lin, fixed = at_largest.get(("linear", warmup_steps)), at_largest.get(("fixed", 0))
    ratio = (lin["steps_to_target"] / fixed["steps_to_target"]
             if lin and fixed and lin["steps_to_target"] and fixed["steps_to_target"] else None)
    # Fewer steps: reached, where fixed did not within max_steps or took more.
    beats = bool(lin and fixed and lin["steps_to_target"] and
                 (fixed["steps_to_target"] is None or lin["steps_to_target"] < fixed["steps_to_target"]))
    return {"model": MODEL, "world_size": world.size, "base_lr": base_lr, "base_batch": base_batch,
            "warmup_steps": warmup_steps, "target_loss": target_loss, "window": WINDOW, "momentum": MOMENTUM,
            "max_steps": max_steps, "rows": rows,
            "largest": {"batch": largest,
                        "fewest": {"rule": fewest["rule"], "warmup_steps": fewest["warmup_steps"],
                                   "steps_to_target": fewest["steps_to_target"]} if fewest else None,
                        "linear_warmup_vs_fixed": ratio, "linear_warmup_beats_fixed": beats}}


def time_to_target_scaling(scaling: dict, critical: dict | None = None, world_size: int | World = 2,
                           target_loss: float = QUICK_TARGET, max_steps: int = 100, backend: str = "auto") -> dict:
    """Lesson 09's weak-scaling run judged by time to a target loss instead of samples per second.

    At W ranks the global batch is W x the per-rank batch, so a step takes the time ``scaling`` measured at W
    and the run needs the steps ``critical_batch`` measures at that global batch (run here at exactly those
    batches unless ``critical`` is given). Time to target = steps x step time; its efficiency, like lesson
    09's, is the speed-up over W = 1 divided by W. Below the critical batch the two efficiencies agree;
    past it, more ranks still add samples per second but hardly save steps.

    The two efficiencies differ by a factor that is counted, not timed: time to target at W over W times the
    time at 1 is ``(step(1) / step(W)) x steps(1) / (W steps(W))``, the samples-per-second efficiency times
    ``steps_factor`` = steps(1) / (W steps(W)), the same on a busy machine as on a quiet one. The step times
    carry their intervals (``efficiency_interval`` of lesson 09's rows), so the time-to-target efficiency
    gets one too. ``target_loss`` defaults to ``QUICK_TARGET``: the steps at three batches with a search over
    rates cost a few seconds, not the half minute of ``TARGET_LOSS``. Where the sweep already searched (its
    ``"critical"``, from ``scaling_sweep(to_target=...)``, at the same target and ``max_steps``) no world starts.

    Returns ``{"rows": [{"world_size", "global_batch", "step_time_s", "steps_to_target", "time_to_target_s",
    "efficiency" (samples per second, lesson 09's), "efficiency_interval", "steps_factor", "efficiency_to_target",
    "efficiency_to_target_interval"}], "critical", "target_loss", "b_crit"}``; it needs a run of the MLP (the
    model ``critical_batch`` trains).
    """
    if scaling.get("model") != MODEL:
        raise ValueError(f"scaling with model={scaling.get('model')!r} is not allowed: the steps to target are "
                         f"measured for the {MODEL!r} (run lesson 09's panel with the MLP)")
    if scaling.get("scaling") != "weak":
        raise ValueError(f"scaling={scaling.get('scaling')!r} is not allowed: only weak scaling changes the global "
                         "batch with W")
    batch_at = {r["world_size"]: r["world_size"] * r["batch_per_rank"] for r in scaling["rows"]}
    ran = scaling.get("critical")  # searched in the sweep's own two-rank world (scaling_sweep(to_target=...))
    if critical is None and ran and ran["target_loss"] == target_loss and ran["max_steps"] == max_steps:
        critical = ran
    if critical is None:
        critical = critical_batch(sorted(set(batch_at.values())), world_size=world_size, target_loss=target_loss,
                                  max_steps=max_steps, backend=backend)
    steps = {r["batch"]: r["steps_to_target"] for r in critical["rows"]}
    missing = sorted(set(batch_at.values()) - set(steps))
    if missing:
        raise ValueError(f"critical has no run at global batch {missing}: give one measured at every W's batch")
    rows = []
    for r in scaling["rows"]:
        s = steps[batch_at[r["world_size"]]]
        rows.append({"world_size": r["world_size"], "global_batch": batch_at[r["world_size"]],
                     "step_time_s": r["step_time_s"], "steps_to_target": s,
                     "time_to_target_s": s * r["step_time_s"] if s else None, "efficiency": r["efficiency"],
                     "efficiency_interval": r.get("efficiency_interval", (r["efficiency"], r["efficiency"]))})
    one = rows[0]["time_to_target_s"] if rows[0]["world_size"] == 1 else None
    first = rows[0]["steps_to_target"] if one else None
    for row in rows:
        t, s = row["time_to_target_s"], row["steps_to_target"]
        row["efficiency_to_target"] = one / (row["world_size"] * t) if one and t else None
        row["steps_factor"] = first / (row["world_size"] * s) if first and s else None
        row["efficiency_to_target_interval"] = (tuple(e * row["steps_factor"] for e in row["efficiency_interval"])
                                                if row["steps_factor"] else None)
    return {"rows": rows, "critical": critical, "target_loss": critical["target_loss"], "b_crit": critical["b_crit"]}
