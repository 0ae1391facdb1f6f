"""Lesson 01, part two: close to single-process training, or identical to it?

The exact strategies end within ~1e-7 of single-process training, never exactly on it, because an
all-reduce adds the W gradients in an order of its own (``sync/deterministic.py`` works through an
example). This experiment trains a model twice on the same W ranks - with ``deterministic``, which
adds every gradient element in rank order, and with an ordinary all-reduce strategy (``bucketed``)
- and holds both to two single-process references:

* ``global batch``: one mean over the global batch, the usual reference (``dpteach/training/reference.py``);
* ``fixed order``: the same process, but each shard's gradient computed on its own and the shards
  added in rank order - the arithmetic ``deterministic`` does across processes.

Only ``deterministic`` against ``fixed order`` can be equal bit for bit. Both references run on
rank 0 after training: a single process, but with the ranks' device and thread count, since a
matrix multiply split over 2 threads can round differently from one on 1 thread.

Why it matters: a bitwise-reproducible run lets you tell a real regression from rounding noise,
and replay a divergence exactly. What it costs is shown by ``dpteach compare --strategies
bucketed,deterministic``: the same bytes as a ring all-reduce, but no overlap with backward.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import replace

import torch
import torch.distributed as dist

from ..ranks import context
from ..ranks.launcher import launch
from ..ranks.torchrun import under_torchrun
from ..ranks.world import World, resolve_world
from ..sync import EXACT
from ..training.reference import exact_tolerance, train_single_process
from ..training.train import TrainConfig, train_on_rank

REFERENCES = {"global batch": False, "fixed order": True}  # name -> fixed_order


# cuBLAS reads this when a process creates its first cuBLAS handle; only then does it make matrix
# multiplies deterministic (CUDA's cuBLAS docs, "Results reproducibility"; torch's
# ``use_deterministic_algorithms`` docstring). Set later in a running process it does nothing, so it is
# given to the ranks at start-up (``launch(env=...)``), never set from inside a rank.
CUBLAS_DETERMINISTIC = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}


@contextmanager
def deterministic_kernels(device: torch.device):
    """On a GPU, ask torch for deterministic kernels inside the block and put its setting back after.

    Some CUDA backward kernels add with atomics, in arrival order; this makes torch pick
    deterministic ones (warning where it has none). On the CPU every kernel used here already is.
    """
    if device.type != "cuda":
        yield
        return
    was, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was, warn_only=warn_only)


def _rank_run(configs: list[TrainConfig]) -> dict | None:
    device = context.device()
    with deterministic_kernels(device):
        return _train_and_refer(configs, device)


def _train_and_refer(configs: list[TrainConfig], device: torch.device) -> dict | None:
    rank0 = dist.get_rank() == 0
    if rank0:
        context.report_progress(0, total=len(configs) + len(REFERENCES), desc="training")
    runs = {}
    for config in configs:
        summary = train_on_rank(config)
        runs[config.strategy] = {"params": summary["params"], "replica_spread": summary["replica_spread"]}
        if rank0:
            context.report_progress(1)
    if not rank0:
        return None
    references = {}
    for name, fixed_order in REFERENCES.items():
        references[name] = train_single_process(configs[0], dist.get_world_size(), fixed_order=fixed_order,
                                                device=str(device), threads=torch.get_num_threads())["params"]
        context.report_progress(1)
    return {"runs": runs, "references": references,
            "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG")}


def bitwise_reproducibility(world_size: int | World | None = 3, model: str = "mlp", steps: int = 10,
                            batch_per_rank: int = 16, accum_steps: int = 1, optimizer: str = "sgd",
                            contrast: str = "bucketed", seed: int = 0, backend: str = "auto",
                            device: str = "auto") -> dict:
    """Train ``deterministic`` and ``contrast`` on W ranks; compare each with both references.

    Returns plain data::

        {"world_size", "model", "steps", "accum_steps", "optimizer", "num_params", "backend", "device",
         "tolerance" (how far an exact strategy may be from the global-batch reference),
         "cublas_workspace_config" (on a GPU: cuBLAS's setting the ranks started with; None means their
                                    matrix multiplies were free to be nondeterministic),
         "rows": [{"strategy", "reference", "max_abs_diff", "differing" (how many weights differ),
                   "bitwise_equal", "replicas_identical"}]}
    """
    if contrast not in EXACT or contrast == "deterministic":
        allowed = ", ".join(s for s in EXACT if s != "deterministic")
        raise ValueError(f"contrast={contrast!r} is not allowed: choose one of {allowed}")
    world = resolve_world(world_size, backend, device)
    base = TrainConfig(strategy="deterministic", model=model, steps=steps, batch_per_rank=batch_per_rank,
                       accum_steps=accum_steps, optimizer=optimizer, seed=seed, timing_warmup=0).check(world.size)
    configs = [base, replace(base, strategy=contrast)]
    # On a GPU the ranks need cuBLAS's setting from their first instant; under torchrun they are
    # already running, so it counts only if it was in their environment (reported below).
    env = CUBLAS_DETERMINISTIC if world.device_type == "cuda" and not under_torchrun() else None
    result = launch(_rank_run, world, args=(configs,), env=env)[0]
    rows = []
    for strategy, run in result["runs"].items():
        for name, params in result["references"].items():
            delta = (run["params"] - params).abs()
            rows.append({"strategy": strategy, "reference": name, "max_abs_diff": delta.max().item(),
                         "differing": int((delta > 0).sum()), "bitwise_equal": torch.equal(run["params"], params),
                         "replicas_identical": run["replica_spread"] == 0.0})
    return {"world_size": world.size, "model": model, "steps": steps, "accum_steps": accum_steps,
            "optimizer": optimizer, "num_params": result["references"]["global batch"].numel(), "rows": rows,
            "tolerance": exact_tolerance(base),
            "cublas_workspace_config": result["cublas_workspace_config"] if world.device_type == "cuda" else None,
            "backend": world.backend, "device": world.device_type}
