"""Lesson 14: methods that send less, judged by the time they take to reach a target loss on a given link.

``methods_to_target`` trains every method once, in one world, step by step side by side, with no emulated
link: the loss after each step, the bytes sent per step, and the steps each needs to reach the target
loss (``dpteach/training/target.py``). ``time_to_target`` then times each method's steps on each emulated
link and puts the two together.

Why two runs and not one per link: a link only delays messages, it changes no number in them, so the
loss after step s is the same on every link (``tests/test_sending_less.py`` checks it, bit for bit); only
the seconds differ. Training a hundred steps on a 30 ms wide-area link for every method would take the
lesson minutes of sleeping. So each method's steps are timed on each link for a short run - a few steps, or
for local SGD and DiLoCo two whole rounds of H steps - and the time to the target is the sum of those
measured step times, continued in the same pattern (one step like the last ones; for local SGD the same
round again) up to the step the loss run reached the target. ``dpteach compare --link`` does it the long
way, every step on the link, and reports the same measure (``time_to_target_s``).
"""
from __future__ import annotations

import statistics
from dataclasses import replace
from itertools import accumulate

from .. import validate
from ..network.link import resolve_link
from ..ranks.launcher import launch
from ..ranks.world import World, resolve_world
from ..training.target import WINDOW, smoothed
from ..training.train import TrainConfig, train_each_on_rank
from .compare import compare_strategies, parse_variant

METHODS = ("ddp", "bf16", "int8_ef", "powersgd@1", "powersgd@4", "powersgd@16",
           "local_sgd@1", "local_sgd@8", "local_sgd@32", "diloco@1", "diloco@8", "diloco@32")
LINKS = ("1gbe", "10gbe", "wan")
BUCKET_MB = 25.0  # DDP's default bucket_cap_mb: the MLP's gradients travel as one bucket, as with torch's hooks
POWERSGD_START = 2  # compress from the third step on (torch's powerSGD_hook needs at least 2 plain steps first)


def methods_to_target(world_size: int | World | None = 2, methods=METHODS, steps: int = 60,
                      optimizer: str = "sgd", target_loss: float | None = None, seed: int = 0,
                      backend: str = "auto", timeout: float = 600.0, **knobs) -> dict:
    """Every method of ``methods`` (names, or ``name@knob`` variants) trained ``steps`` steps on the MLP.

    Two ranks by default: twelve methods side by side on a laptop's two cores, each rank on a core of its
    own. ``dpteach compare -w 4`` runs the same methods on four.

    Returns ``{"world_size", "steps", "optimizer", "target_loss", "target_rule", "window", "reference":
    smoothed single-process curve, "rows": [{"method", "strategy", "knobs", "bytes_per_step",
    "bytes_vs_ddp", "steps_to_target", "final_loss", "curve", "losses", "exact", "max_abs_diff_vs_single"}]}``;
    ``curve`` is the loss averaged over the last ``window`` steps. ``knobs``: the strategies' own options for
    every method (``outer_lr=1.0``, ``outer_momentum=0.0``; ``TrainConfig``'s fields).
    """
    validate.integer("steps", steps, low=WINDOW)
    report = compare_strategies(world_size, model="mlp", steps=steps, strategies=list(methods), optimizer=optimizer,
                                interleave=True, bucket_mb=BUCKET_MB, target_loss=target_loss, seed=seed,
                                backend=backend, timeout=timeout, **{"powersgd_start": POWERSGD_START, **knobs})
    ddp = next((row["bytes_per_step"] for row in report["rows"] if row["strategy"] == "ddp"), None)
    rows = []
    for row in report["rows"]:
        method = row["strategy"]  # the name as asked: powersgd@4
        losses = report["runs"][method][0]["losses"]  # the mean over the ranks, step by step
        curve = smoothed(losses)
        rows.append({"method": method, "strategy": method.partition("@")[0], "knobs": row["knobs"],
                     "bytes_per_step": row["bytes_per_step"],
                     "bytes_vs_ddp": None if not ddp else row["bytes_per_step"] / ddp,
                     "steps_to_target": row["steps_to_target"], "final_loss": curve[-1], "losses": losses,
                     "curve": curve, "exact": row["exact"], "max_abs_diff_vs_single": row["max_abs_diff_vs_single"]})
    return {"world_size": report["world_size"], "steps": steps, "optimizer": optimizer, "seed": seed, "knobs": knobs,
            "bucket_mb": BUCKET_MB, "powersgd_start": POWERSGD_START, "batch_per_rank": report["batch_per_rank"],
            "target_loss": report["target_loss"], "target_rule": report["target_rule"], "window": WINDOW,
            "reference": smoothed(report["reference_losses"]), "rows": rows}


def timing_steps(config: TrainConfig) -> tuple[int, int, int]:
    """How many steps to time a method for, the period its step times repeat with, and the first step that is
    like every later one (``projected_times``' ``steady_from``): two whole rounds of
    H steps for local SGD and DiLoCo (at least three steps); PowerSGD's plain steps plus two compressed ones; three
    otherwise (the first carries the start-up, so two are steady)."""
    if "sync_every" in config.knobs():
        return max(2 * config.sync_every, 3), config.sync_every, 1
    if "powersgd_start" in config.knobs():
        return config.powersgd_start + 2, 1, config.powersgd_start
    return 3, 1, 1


def projected_times(measured: list[float], period: int, steps: int, steady_from: int = 1) -> list[float]:
    """``steps`` step times: the measured ones, then the last ``period`` of them again and again (for period
    1, the mean of the measured steps from ``steady_from`` on: the first carries the start-up, and PowerSGD's
    first steps are plain all-reduces)."""
    if period == 1:
        steady = statistics.mean(measured[steady_from:] or measured)
        return [measured[s] if s < len(measured) else steady for s in range(steps)]
    cycle = measured[-period:]
    return [measured[s] if s < len(measured) else cycle[(s - len(measured)) % period] for s in range(steps)]


def _timed_on_rank(configs: list[TrainConfig]) -> list[dict]:
    """Only what the timing needs travels back: each run's step times and its link's account."""
    return [{k: out[k] for k in ("step_times", "link")} for out in train_each_on_rank(configs)]


def time_to_target(convergence: dict, links=LINKS, backend: str = "auto", timeout: float = 600.0) -> dict:
    """Each method of ``convergence`` (what ``methods_to_target`` returned) timed on each link of ``links``.

    Returns ``{"links": [link dicts], "target_loss", "rows": [{"method", "link", "step_times" (measured),
    "period", "mean_step_s", "time_to_target_s" (None: the target was not reached), "seconds": projected
    cumulative seconds after each step, for loss-against-time plots, "time_set_by"}], "winner": {link: method}}``.
    """
    if isinstance(links, str) or not links or None in links:
        raise validate.refusal("links", links, "give a list of one or more emulated links (preset names such as "
                               "'1gbe', '10gbe', 'wan', or {'alpha_s', 'beta_s_per_byte'})")
    emulated = [resolve_link(link, "links") for link in links]
    world = resolve_world(convergence["world_size"], backend, "auto")
    base = TrainConfig(model="mlp", optimizer=convergence["optimizer"], seed=convergence["seed"],
                       bucket_mb=convergence["bucket_mb"], batch_per_rank=convergence["batch_per_rank"],
                       powersgd_start=convergence["powersgd_start"], timing_warmup=0, **convergence["knobs"])
    configs, plan = [], []
    for link in emulated:
        for row in convergence["rows"]:
            name, knobs = parse_variant(row["method"])
            config = replace(base, strategy=name, **knobs, link=link)
            steps, period, steady_from = timing_steps(config)
            configs.append(replace(config, steps=steps, num_samples=convergence["steps"] * config.global_batch(
                world.size)).check(world))
            plan.append((row, link, period, steady_from))
    per_rank = launch(_timed_on_rank, world, args=(configs,), timeout=timeout)
    rows, steps = [], convergence["steps"]
    for i, (row, link, period, steady_from) in enumerate(plan):
        measured = [max(per_rank[r][i]["step_times"][s] for r in range(world.size))  # a step ends when all have
                    for s in range(len(per_rank[0][i]["step_times"]))]
        seconds = list(accumulate(projected_times(measured, period, steps, steady_from)))
        reached = row["steps_to_target"]
        report = per_rank[0][i]["link"] or {}
        rows.append({"method": row["method"], "link": link.name, "step_times": measured, "period": period,
                     "mean_step_s": seconds[-1] / steps, "seconds": seconds,
                     "time_to_target_s": None if reached is None else seconds[reached - 1],
                     "time_set_by": report.get("time_set_by")})
    winner = {}
    for link in emulated:
        timed = [r for r in rows if r["link"] == link.name and r["time_to_target_s"] is not None]
        winner[link.name] = min(timed, key=lambda r: r["time_to_target_s"])["method"] if timed else None
    return {"links": [link.as_dict() for link in emulated], "target_loss": convergence["target_loss"],
            "steps": steps, "rows": rows, "winner": winner}


def outer_step(sync_every: int = 8, outer_lr: float = 0.7, outer_momentum: float = 0.9, steps: int = 60,
               world_size: int | World | None = 2, optimizer: str = "sgd", backend: str = "auto",
               timeout: float = 300.0) -> dict:
    """Local SGD against DiLoCo at the same H, with DiLoCo's outer step as given (outer_lr 1 and momentum 0 is
    local SGD again): what ``methods_to_target`` returns for those two."""
    validate.integer("sync_every", sync_every, low=1)
    return methods_to_target(world_size, methods=(f"local_sgd@{sync_every}", f"diloco@{sync_every}"), steps=steps,
                             optimizer=optimizer, backend=backend, timeout=timeout, outer_lr=outer_lr,
                             outer_momentum=outer_momentum)
