"""The runs of lessons 15 and 09 that train the MLP on W ranks to a target loss at a given global batch: one run
(:func:`train_run`), several side by side in one world (:func:`runs_on_rank`), the search for each batch's best
learning rate (:func:`search_on_rank`) and the critical-batch result from it (:func:`critical_result`).

Every run trains the course's MLP from the same seed on the same stream of fresh samples (one pass, no sample
seen twice, as in the large-batch papers' regime). A global batch of B samples is W ranks x K accumulated
micro-batches x B / (W K) samples, so a laptop reaches 4096 with micro-batches of at most ``MAX_MICRO``
samples. Each step all-reduces the gradients *and* two numbers beside them, the rank's own squared gradient
norm and its loss, so every rank sees the same mean loss and takes the same decisions (when a run reached its
target, which learning rate to try next), and the noise scale comes out of the same all-reduce
(``training/batch_rules.py`` explains the estimator).

Lesson 15's experiments (``batch_size.py``) and lesson 09's time to a target (``scaling.py``, inside the world
its sweep has started) both stand on this module; it imports no other experiment.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..ranks import context
from ..replica.data import make_dataset, rank_microbatches, sample_batch
from ..replica.models import build_model
from ..training.batch_rules import NoiseScale, fit_steps, lr_at
from ..training.target import WINDOW, smoothed

MODEL = "mlp"
MAX_MICRO = 256  # samples per micro-batch at most; larger per-rank batches accumulate
MOMENTUM = 0.9
DIVERGED = 5.0  # a loss above this many times the first counts as diverged (a spike that recovers stays below)
LR_GRID = tuple(0.0025 * 2 ** i for i in range(9))  # 0.0025 .. 0.64


def split(batch: int, world_size: int, name: str = "batch") -> tuple[int, int]:
    """(per-rank micro-batch, accumulation steps) for a global ``batch`` on ``world_size`` ranks."""
    per_rank, rest = divmod(batch, world_size)
    if rest or per_rank < 1:
        raise ValueError(f"{name}={batch} is not allowed on {world_size} ranks: a global batch must be a multiple "
                         "of the world size")
    accum = max(1, math.ceil(per_rank / MAX_MICRO))
    while per_rank % accum:
        accum += 1
    return per_rank // accum, accum


def _step_data(run: dict, step: int):
    """The global batch of ``step``: ``run["batch"]`` fresh samples drawn from the step's own seed, so a run's
    data do not depend on which other runs share the launch or how long they are."""
    return make_dataset(MODEL, run["batch"], seed=1 + step + 100_003 * run.get("seed", 0))


def train_run(run: dict, world_size: int, rank: int, stop_after: int | None = None) -> dict:
    """One run on this rank; every rank returns the same record (losses and decisions are all-reduced)."""
    batch = run["batch"]
    micro, accum = split(batch, world_size)
    model = build_model(MODEL, seed=run.get("seed", 0), device=context.device())
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=run["lr"], momentum=MOMENTUM)
    noise, losses, lrs = NoiseScale(), [], []
    limit = min(run["max_steps"], stop_after) if stop_after else run["max_steps"]
    reached = diverged = None
    for step in range(limit):
        lr = lr_at(step, run["lr"], run["base_lr"], run.get("warmup_steps", 0))
        for group in optimizer.param_groups:
            group["lr"] = lr
        data = _step_data(run, step)
        optimizer.zero_grad(set_to_none=False)
        loss_sum = 0.0
        for part in rank_microbatches(list(range(batch)), rank, world_size, micro, accum):
            x, y = (t.to(context.device()) for t in sample_batch(data, part))
            loss = F.cross_entropy(model(x), y) / accum
            loss.backward()
            loss_sum += loss.item()
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        local = torch.stack([flat.pow(2).sum(), torch.tensor(loss_sum, device=flat.device)])
        message = torch.cat([flat, local]) / world_size
        dist.all_reduce(message)  # the mean gradient, the mean of the ranks' squared norms, the mean loss
        offset = 0
        for p in params:
            p.grad.copy_(message[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        mean_sq, mean_loss = message[-2].item(), message[-1].item()
        if world_size > 1:
            noise.add(mean_sq, message[:-2].pow(2).sum().item(), batch / world_size, batch)
        optimizer.step()
        losses.append(mean_loss)
        lrs.append(lr)
        if not math.isfinite(mean_loss) or mean_loss > DIVERGED * losses[0]:
            diverged = step + 1
            break
        if smoothed(losses[-WINDOW:])[-1] <= run["target"]:  # lesson 14's rule: the running mean
            reached = step + 1
            break
    return {**run, "micro_batch": micro, "accum_steps": accum, "losses": losses, "lrs": lrs,
            "steps_to_target": reached, "samples_to_target": reached * batch if reached else None,
            "diverged_at": diverged, "stopped_at": None if reached or diverged else len(losses),
            "noise": noise.as_dict()}


def runs_on_rank(runs: list[dict]) -> list[dict]:
    out = []
    for run in runs:
        out.append(train_run(run, context.world_size(), context.rank()))
        if context.rank() == 0:
            context.report_progress(1, total=len(runs), desc="runs")
    return out


def search_on_rank(batches: list[int], target: float, max_steps: int, start_lr: float) -> list[dict]:
    """Per batch, the best learning rate of ``LR_GRID`` by steps to target, searched greedily: start where the
    previous batch's best was, walk up the grid while that saves steps, else down. A run that has not
    reached the target when it has taken as many steps as the best so far stops there (it cannot win)."""
    at = min(range(len(LR_GRID)), key=lambda i: abs(math.log(LR_GRID[i] / start_lr)))
    rows = []
    if context.rank() == 0:  # announced at once: the bar shows from the first run on, not after the first batch
        context.report_progress(0, total=len(batches), desc=f"batches {batches[0]} to {batches[-1]}")
    for batch in batches:
        tried = {}

        def attempt(i):
            best = min((r["steps_to_target"] for r in tried.values() if r["steps_to_target"]), default=None)
            run = {"batch": batch, "lr": LR_GRID[i], "base_lr": LR_GRID[i], "max_steps": max_steps, "target": target}
            tried[i] = train_run(run, context.world_size(), context.rank(), stop_after=best)

        def better(i, j):  # did grid point i take fewer steps than j?
            a, b = tried[i]["steps_to_target"], tried[j]["steps_to_target"]
            return a is not None and (b is None or a < b)

        def walk(direction) -> int:
            i = at
            while 0 <= i + direction < len(LR_GRID):
                attempt(i + direction)
                if not better(i + direction, i):
                    break
                i += direction
            return i

        attempt(at)
        if walk(+1) == at:
            walk(-1)
        best_i = min(tried, key=lambda i: (tried[i]["steps_to_target"] or math.inf, i))
        at = best_i
        best = tried[best_i]
        rows.append({"batch": batch, "micro_batch": best["micro_batch"], "accum_steps": best["accum_steps"],
                     "best_lr": LR_GRID[best_i] if best["steps_to_target"] else None,
                     "steps_to_target": best["steps_to_target"], "samples_to_target": best["samples_to_target"],
                     "losses": best["losses"], "noise": best["noise"],
                     "tried": [{"lr": LR_GRID[i], "steps_to_target": r["steps_to_target"],
                                "diverged_at": r["diverged_at"], "stopped_at": r["stopped_at"]}
                               for i, r in sorted(tried.items())]})
        if context.rank() == 0:
            context.report_progress(1, total=len(batches), desc="batches")
    return rows


def critical_result(rows: list[dict], world_size: int, target_loss: float, max_steps: int) -> dict:
    """``critical_batch``'s result from the rows of :func:`search_on_rank`, wherever the search ran (its own world,
    or one that lesson 09's sweep had started already: ``scaling_sweep(to_target=...)``)."""
    reached = [r for r in rows if r["steps_to_target"]]
    fit = fit_steps([r["batch"] for r in reached], [r["steps_to_target"] for r in reached]) \
        if len({r["batch"] for r in reached}) >= 2 else None
    pooled = NoiseScale.pooled(r["noise"] for r in reached)
    return {"model": MODEL, "world_size": world_size, "target_loss": target_loss, "window": WINDOW,
            "momentum": MOMENTUM, "lr_grid": list(LR_GRID), "max_steps": max_steps, "rows": rows, "fit": fit,
            "noise_scale": pooled.as_dict(), "b_crit": fit["b_noise"] if fit else None}
