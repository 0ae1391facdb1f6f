"""Lesson 08: two ways the data can break a data-parallel job, run on real ranks.

**A forgotten sharded sampler** (``sampler_sharding``). Data parallelism only helps if each rank
trains on a *different* share of the batch. A script that builds an ordinary shuffled
``DataLoader`` on every rank, seeded alike for reproducibility, hands every rank the very same
samples: the W gradients are equal, their average is each rank's own gradient, and W ranks do the
work of one while every epoch visits each sample W times. ``torch.utils.data.DistributedSampler``
gives rank r every W-th position of a shared permutation, so the shares are disjoint and cover
the dataset (padded by repeating samples when ``drop_last=False``, trimmed when ``True``).

**An uneven last batch** (``uneven_inputs``). When ranks read data they split themselves (files
per rank, an ``IterableDataset``, a sampler without padding), one rank can hold one batch more.
Its extra step's all-reduce has no partner: the other ranks have left the loop and wait somewhere
else (here: a barrier before saving a checkpoint), so every rank blocks until a timeout. Two
fixes, both measured:

* ``torch.distributed.algorithms.Join`` with DDP: a rank that runs out of data *joins*, and from
  then on shadows the collectives of the ranks still training (DDP's join hook all-reduces zeros
  in place of its gradient), then the final model is broadcast from the last rank to join, so the
  replicas still agree (torch ``distributed/algorithms/join.py``; ``nn/parallel/distributed.py``,
  ``_DDPJoinHook``);
* dropping the last batch: the ranks agree on the smallest number of batches (one all-reduce of
  their counts with MIN) and all take that many steps.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from .. import validate

from ..ranks import context
from ..ranks.launcher import RankError, launch
from ..ranks.world import World, resolve_world
from ..replica.build import flat_weights, replica_spread
from ..replica.data import loss_fn, make_dataset, sample_batch
from ..replica.models import build_model, check_model_name
from ..sync.ddp import wrap_ddp


def _check_positive(**values) -> None:
    for name, value in values.items():
        validate.integer(name, value, low=1)


# -- a forgotten sampler -------------------------------------------------------------------------

def _loader(samples: int, batch: int, seed: int, sharded: bool) -> DataLoader:
    if sharded:
        sampler = DistributedSampler(range(samples), shuffle=True, seed=seed)  # rank and W from the world
        return DataLoader(range(samples), batch_size=batch, sampler=sampler)
    # The bug: a plain shuffled loader, seeded the same on every rank "for reproducibility".
    return DataLoader(range(samples), batch_size=batch, shuffle=True,
                      generator=torch.Generator().manual_seed(seed))


def _sampler_on_rank(model_name: str, samples: int, batch: int, epochs: int, seed: int) -> dict:
    dataset, criterion = make_dataset(model_name, samples, seed=seed), loss_fn(model_name)
    out = {}
    for name, sharded in (("no distributed sampler", False), ("DistributedSampler", True)):
        loader = _loader(samples, batch, seed, sharded)
        order = []
        for epoch in range(epochs):
            if sharded:
                loader.sampler.set_epoch(epoch)
            order.append([int(i) for b in loader for i in b])
        first = next(iter(loader))  # the last epoch's first batch
        model = build_model(model_name, seed=seed).to(context.device())
        x, y = (t.to(context.device()) for t in sample_batch(dataset, first.tolist()))
        criterion(model(x), y).backward()
        own = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        average = own.clone()
        dist.all_reduce(average)
        average /= dist.get_world_size()
        out[name] = {"order": order, "steps_per_epoch": len(loader), "grad_spread": replica_spread(own.cpu()),
                     "average_vs_own": (average - own).abs().max().item(), "grad_scale": own.abs().max().item()}
    return out


def sampler_sharding(world_size: int | World | None = 2, model: str = "mlp", samples: int = 64, batch_per_rank: int = 8,
                     epochs: int = 2, seed: int = 0, backend: str = "auto", device: str = "auto") -> dict:
    """Which samples each rank trains on, with and without a distributed sampler.

    Returns ``{"world_size", "backend", "device", "model", "samples", "batch_per_rank", "epochs",
    "rows": [{"loader", "order": {rank: [[sample ids of epoch e]]}, "steps_per_epoch",
    "distinct_in_first_step" (samples of the ranks' first batches, counted once),
    "visits_per_sample" (how often one epoch of every rank touches each sample, on average),
    "shards_disjoint", "covers_dataset", "grad_spread" (largest gradient difference between ranks
    on one batch), "average_vs_own" (all-reduced average minus this rank's own gradient)}]}``.
    """
    check_model_name(model)
    _check_positive(samples=samples, batch_per_rank=batch_per_rank, epochs=epochs)
    world = resolve_world(world_size, backend, device)
    if samples < world.size * batch_per_rank:
        raise ValueError(f"samples={samples!r} is not allowed: it must be at least world_size x batch_per_rank "
                         f"= {world.size * batch_per_rank}, so that every rank gets a full batch")
    per_rank = launch(_sampler_on_rank, world, args=(model, samples, batch_per_rank, epochs, seed), timeout=120)
    rows = []
    for name in per_rank[0]:
        runs = [per_rank[r][name] for r in range(world.size)]
        first_step = [set(run["order"][0][:batch_per_rank]) for run in runs]
        epoch0 = [run["order"][0] for run in runs]
        seen = [i for share in epoch0 for i in share]
        rows.append({"loader": name, "order": {r: runs[r]["order"] for r in range(world.size)},
                     "steps_per_epoch": runs[0]["steps_per_epoch"],
                     "distinct_in_first_step": len(set().union(*first_step)),
                     "visits_per_sample": len(seen) / samples,
                     "shards_disjoint": len(seen) == len(set(seen)), "covers_dataset": set(seen) == set(range(samples)),
                     "grad_spread": runs[0]["grad_spread"], "average_vs_own": max(run["average_vs_own"] for run in runs),
                     "grad_scale": runs[0]["grad_scale"]})
    return {"world_size": world.size, "backend": world.backend, "device": world.device_type, "model": model,
            "samples": samples, "batch_per_rank": batch_per_rank, "epochs": epochs, "rows": rows}


# -- an uneven last batch ------------------------------------------------------------------------

FIXES = ("join", "drop_last")
QUIET_S = 1.0  # a world whose ranks all said nothing new for this long is stuck: a step of the mlp takes milliseconds


def _note(folder: str, text: str) -> None:
    """Say where this rank is, and when it said so, atomically, so the caller can read it even after a timeout."""
    path = os.path.join(folder, f"rank{dist.get_rank()}.json")
    with open(f"{path}.tmp", "w") as f:
        json.dump({"rank": dist.get_rank(), "at": text, "time": time.time()}, f)
    os.replace(f"{path}.tmp", path)


def _train(mode: str, model_name: str, batches: list[int], batch: int, seed: int, folder: str) -> dict:
    from torch.distributed.algorithms import Join
    rank = dist.get_rank()
    mine = batches[rank]
    dataset, criterion = make_dataset(model_name, sum(batches) * batch, seed=seed), loss_fn(model_name)
    first = sum(batches[:rank]) * batch  # this rank's own contiguous share, as if split by files
    model = build_model(model_name, seed=seed)
    ddp = wrap_ddp(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    steps = mine
    if mode == "drop_last":
        count = torch.tensor([mine], device=context.device())
        dist.all_reduce(count, op=dist.ReduceOp.MIN)
        steps = int(count.item())

    def loop():
        for s in range(steps):
            _note(folder, f"{mode}: step {s + 1} of {steps} (forward, backward, gradient all-reduce)")
            x, y = (t.to(context.device()) for t in
                    sample_batch(dataset, range(first + s * batch, first + (s + 1) * batch)))
            optimizer.zero_grad()
            criterion(ddp(x), y).backward()
            optimizer.step()

    if mode == "join":
        with Join([ddp]):
            loop()
    else:
        loop()
    _note(folder, f"{mode}: finished {steps} steps; waiting at the barrier before saving a checkpoint")
    dist.barrier()
    _note(folder, f"{mode}: done")
    return {"mode": mode, "batches": mine, "steps": steps, "replica_spread": replica_spread(flat_weights(model))}


def _uneven_on_rank(modes, model_name, batches, batch, seed, folder):
    return [_train(mode, model_name, batches, batch, seed, folder) for mode in modes]


def _notes(folder: str, world_size: int, key: str = "at") -> dict:
    notes = {}
    for rank in range(world_size):
        path = os.path.join(folder, f"rank{rank}.json")
        if os.path.exists(path):
            with open(path) as f:
                notes[rank] = json.load(f)[key]
    return notes


def uneven_inputs(world_size: int | World | None = 2, model: str = "mlp", batches: int = 4, batch_per_rank: int = 16,
                  stall_timeout_s: float = 4.0, seed: int = 0, backend: str = "auto", device: str = "auto") -> dict:
    """Rank 0 holds ``batches + 1`` batches, the others ``batches``: the plain loop, then Join and drop-last.

    Returns ``{"world_size", "backend", "device", "model", "batches_by_rank", "stall_timeout_s",
    "plain": {"outcome" ("stalled" | "finished" | "raised" | "crashed"), "message", "seconds",
    "where": {rank: the last thing it said it was doing}}, "fixes": [{"mode", "steps_by_rank",
    "replica_spread", "seconds"}]}``.
    """
    check_model_name(model)
    _check_positive(batches=batches, batch_per_rank=batch_per_rank)
    validate.number("stall_timeout_s", stall_timeout_s, above=0, unit="seconds")
    world = resolve_world(world_size, backend, device)
    per_rank = [batches + 1] + [batches] * (world.size - 1)
    common = dict(show_output=False)
    folder = tempfile.mkdtemp(prefix="dpteach-uneven-")
    try:
        # The launcher's timeout also covers the ranks' start-up (importing torch: seconds, more on a busy
        # machine). A stall is a world in which no rank has moved on for a while; a timeout that came while a
        # rank had not yet said where it was, or had said so within the last QUIET_S, timed the start-up or a
        # slow loop instead. Then the plain loop runs once more, allowed the time it was seen to need on top.
        timeout = stall_timeout_s
        for attempt in range(2):
            for name in os.listdir(folder):  # what an earlier attempt's ranks said is not where these ranks are
                os.remove(os.path.join(folder, name))
            start, deadline = time.perf_counter(), time.time() + timeout  # when the launcher gives up on the ranks
            plain = {"outcome": "finished", "message": ""}
            try:
                launch(_uneven_on_rank, world, args=(["plain"], model, per_rank, batch_per_rank, seed, folder),
                       timeout=timeout, **common)
            except TimeoutError as err:
                plain = {"outcome": "stalled", "message": str(err)}
            except RankError as err:
                plain = {"outcome": "raised" if err.exc_type else "crashed", "message": str(err).splitlines()[0]}
            plain.update(seconds=time.perf_counter() - start, where=_notes(folder, world.size))
            said = _notes(folder, world.size, "time")
            quiet = deadline - max(said.values()) if len(said) == world.size else 0.0
            if plain["outcome"] != "stalled" or quiet >= QUIET_S:
                break
            timeout = stall_timeout_s + plain["seconds"]
        start = time.perf_counter()
        fixed = launch(_uneven_on_rank, world, args=(FIXES, model, per_rank, batch_per_rank, seed, folder),
                       timeout=120, **common)
        seconds = time.perf_counter() - start
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    fixes = [{"mode": mode, "steps_by_rank": [fixed[r][i]["steps"] for r in range(world.size)],
              "replica_spread": fixed[0][i]["replica_spread"]} for i, mode in enumerate(FIXES)]
    return {"world_size": world.size, "backend": world.backend, "device": world.device_type,
            "model": model, "batches_by_rank": per_rank, "stall_timeout_s": stall_timeout_s, "plain": plain,
            "fixes": fixes, "fixes_seconds": seconds}
