"""A checkpoint that resumes a run exactly: what it must hold, written by every rank, read at any W.

A run resumed from step s must go on as if nothing had happened. The weights are not enough; at step s
a run also holds::

    model        the weights                              (a shard per rank in zero3 and fsdp)
    optimizer    SGD's momentum, Adam's two moments       (a shard per rank in zero1/2/3 and fsdp)
    rng          each rank's random generator             (dropout, augmentation: here input noise)
    data         where the sampler is: epoch and batch    (a fresh sampler starts at epoch 0, batch 0)
    scaler       fp16's loss scale and its clean-step count
    progress     the step itself, and the run it belongs to

Each piece but the model and the progress can be left out on load (``leave_out``), which is how lesson 13
shows what each one is for: the resumed run then differs from the uninterrupted one.

**Written by every rank, once.** ``torch.distributed.checkpoint`` (DCP) has each rank write its own file
(``__<rank>_0.distcp``); rank 0 adds the ``.metadata`` that says which rank wrote which piece of which
tensor. A tensor every rank holds alike (DDP's weights) is written once, not W times: DCP's default save
planner keeps each duplicate in one rank's plan only, the plan with the fewest bytes so far, so the ranks
share the writing (``dedup_save_plans`` in ``torch/distributed/checkpoint/_dedup_save_plans.py``; with
``DefaultSavePlanner(dedup_save_to_lowest_rank=True)`` the lowest rank takes them all).
A sharded tensor is described as a ``DTensor``, whole shape plus this rank's piece; loading it into the
DTensors of a run with another W reads each rank's new piece from whichever files hold it: DCP reshards.

**The course's own ZeRO shards.** ``sync/sharding.py`` pads each flat group to a multiple of W, so a
shard depends on W. Its *unpadded* part is exactly ``torch.chunk``'s piece of the flat group, which is the
piece a DTensor sharded on dim 0 holds, so every flat group is saved as a DTensor of its true length:
the checkpoint itself no longer depends on W. FSDP2's parameters are DTensors already, and DDP's state
goes through torch's own ``get_state_dict``/``set_state_dict`` (``torch/distributed/checkpoint/state_dict.py``).

**Complete or absent.** A rank killed while writing must not leave a checkpoint that looks whole: each
one is written into ``step-000123.partial/`` and renamed by rank 0 once every rank has written (the
rename is atomic), and ``latest_checkpoint`` only sees the renamed ones.
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from .. import validate
from ..ranks import context

PIECES = ("optimizer", "rng", "data", "scaler")  # what may be left out; the weights and the step never are
RESUMABLE = ("naive", "bucketed", "overlap", "ddp", "zero1", "zero2", "zero3", "fsdp")
SHARDED_FLAT = ("zero1", "zero2", "zero3")  # the course's own flat shards (sync/sharding.py)


def check_leave_out(leave_out) -> tuple:
    leave_out = tuple(leave_out or ())
    for piece in leave_out:
        validate.choice("leave_out", piece, PIECES)
    return leave_out


def check_resumable(strategy: str) -> None:
    if strategy not in RESUMABLE:
        raise ValueError(f"strategy={strategy!r} is not allowed with checkpoints: choose one of {', '.join(RESUMABLE)} "
                         f"(the others keep state this checkpoint does not save: error-feedback residuals, a "
                         f"parameter server's queue, local models that never meet)")


def step_name(step: int) -> str:
    return f"step-{step:06d}"


def latest_checkpoint(directory) -> tuple[int, Path] | None:
    """The newest complete checkpoint in ``directory`` as ``(step, path)``, or None."""
    found = sorted(p for p in Path(directory).glob("step-*") if p.is_dir() and not p.name.endswith(".partial"))
    return (int(found[-1].name.split("-")[1]), found[-1]) if found else None


# --- what the state is -------------------------------------------------------------------------------------

def _flat_dtensor(local: torch.Tensor, numel: int, mesh):
    """A flat group's shard as the DTensor of its unpadded length: ``local`` is shard r, padding included."""
    from torch.distributed.tensor import DTensor, Shard
    rank = dist.get_rank()
    chunk = local.numel()
    start, end = min(rank * chunk, numel), min((rank + 1) * chunk, numel)
    return DTensor.from_local(local[:end - start], mesh, [Shard(0)], run_check=False, shape=(numel,), stride=(1,))


def ensure_optimizer_state(optimizer) -> None:
    """Give every parameter the state its optimizer would create at its first step (zeros, step 0), so
    that DCP has tensors to load into. SGD's momentum starts as the first gradient, ``0.9 * 0 + g``,
    the same as from zeros; Adam's moments start at zero anyway."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state[p]
            if state:
                continue
            if isinstance(optimizer, torch.optim.Adam):
                state.update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
            elif group.get("momentum", 0):
                state["momentum_buffer"] = torch.zeros_like(p)


def _sharded_state(trainer, mesh) -> dict:
    """zero1/2/3: the flat groups' shards (weights in zero3 only; zero1/2 keep whole weights on every rank)."""
    strategy, optimizer = trainer.strategy, trainer.optimizer
    state = {}
    if strategy.name == "zero3":
        for i, group in enumerate(strategy.groups):
            state[f"model/group{i}"] = _flat_dtensor(group.shard.data, group.numel, mesh)
    else:
        state.update({f"model/{k}": v for k, v in trainer.module.state_dict().items()})
    ensure_optimizer_state(optimizer)
    for i, group in enumerate(strategy.groups):
        for key, value in optimizer.state[group.shard].items():
            if value.dim() == 0:  # Adam's step count: the same on every rank
                state[f"optimizer/group{i}/{key}"] = value
            else:
                state[f"optimizer/group{i}/{key}"] = _flat_dtensor(value, group.numel, mesh)
    return state


def _torch_state(trainer) -> dict:
    """DDP, FSDP2 and the replicated strategies: torch's own state-dict helpers (FSDP2's are DTensors)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    ensure_optimizer_state(trainer.optimizer)
    model, optim = get_state_dict(trainer.module, trainer.optimizer)
    return {**{f"model/{k}": v for k, v in model.items()}, "optimizer": optim}


def training_state(trainer, step: int) -> dict:
    """Everything of this rank's run at ``step``, as DCP saves and loads it (tensors are the run's own)."""
    strategy = trainer.strategy
    if strategy.name in SHARDED_FLAT:
        from torch.distributed.device_mesh import DeviceMesh
        state = _sharded_state(trainer, DeviceMesh.from_group(dist.group.WORLD, context.device().type))
    else:
        state = _torch_state(trainer)
    rank = dist.get_rank()
    state[f"rng/rank{rank}"] = torch.get_rng_state()
    if context.device().type == "cuda":
        state[f"rng/cuda/rank{rank}"] = torch.cuda.get_rng_state(context.device())
    state["data"] = {"batches_drawn": step}  # one global batch per step: the sampler's place in its epochs
    scaler = trainer.precision.scaler
    state["scaler"] = None if scaler is None else {"scale": float(scaler.scale), "clean_steps": scaler.clean_steps}
    state["progress"] = {"step": step, "world_size": dist.get_world_size(), "strategy": strategy.name,
                         "model": trainer.config.model, "global_batch": trainer.config.global_batch(dist.get_world_size())}
    return state


# --- save and load -----------------------------------------------------------------------------------------

def save_checkpoint(trainer, directory, step: int, keep: int = 2) -> dict:
    """Write the run's state at ``step`` (after ``step`` optimizer steps) into ``directory``; every rank calls
    it. Returns ``{"path", "bytes", "seconds"}``. Keeps the ``keep`` newest checkpoints."""
    directory = Path(directory)
    final = directory / step_name(step)
    partial = directory / (step_name(step) + ".partial")
    started = time.perf_counter()
    if dist.get_rank() == 0:
        shutil.rmtree(partial, ignore_errors=True)
    dist.barrier()
    # dcp.save returns on every rank only after rank 0 has gathered every rank's write results and written the
    # metadata (its "finish" step is an all-reduce, state_dict_saver.py): the folder is whole here.
    dcp.save(training_state(trainer, step), checkpoint_id=str(partial))
    if dist.get_rank() == 0:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(partial, final)  # from here on the checkpoint exists, whole
        for old in sorted(p for p in directory.glob("step-*") if not p.name.endswith(".partial"))[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return {"path": str(final), "bytes": checkpoint_bytes(final), "seconds": time.perf_counter() - started}


def checkpoint_bytes(path) -> int:
    return sum(f.stat().st_size for f in Path(path).iterdir() if f.is_file())


def saved_keys(path) -> set:
    return set(dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata)


def load_checkpoint(trainer, path, leave_out=()) -> dict:
    """Load the checkpoint at ``path`` into this rank's run, in place, except the pieces in ``leave_out``.
    Returns its ``progress`` plus ``data`` (None when left out) and what was restored."""
    leave_out = check_leave_out(leave_out)
    state = training_state(trainer, 0)
    keys = saved_keys(path)
    if "optimizer" in leave_out:
        state = {k: v for k, v in state.items() if not k.startswith("optimizer")}
    # A rank that did not exist in the saved run has no generator state to take: it keeps its fresh one.
    state = {k: v for k, v in state.items() if not k.startswith("rng/") or ("rng" not in leave_out and k in keys)}
    for piece in ("data", "scaler"):
        if piece in leave_out:
            state.pop(piece)
    dcp.load(state, checkpoint_id=str(path))
    _restore(trainer, state)
    pieces = {k.split("/")[0] for k in state} - {"progress"}
    if state.get("scaler") is None:  # an fp32 run has no loss scale: nothing of it was restored
        pieces.discard("scaler")
    return {"progress": state["progress"], "data": state.get("data"), "restored": sorted(pieces)}


def _restore(trainer, state: dict) -> None:
    """What DCP did not write in place: the model and optimizer through torch's helpers (DDP, FSDP2), the
    generators and the scaler; an optimizer state left out is dropped, as if it had never been saved."""
    strategy = trainer.strategy
    if strategy.name not in SHARDED_FLAT:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict
        set_model_state_dict(trainer.module, {k[len("model/"):]: v for k, v in state.items() if k.startswith("model/")})
        if "optimizer" in state:
            set_optimizer_state_dict(trainer.module, trainer.optimizer, state["optimizer"])
    if not any(k.startswith("optimizer") for k in state):
        trainer.optimizer.state.clear()  # as if never saved: the first step after resuming starts it afresh
    rank = dist.get_rank()
    if f"rng/rank{rank}" in state:
        torch.set_rng_state(state[f"rng/rank{rank}"])
    if f"rng/cuda/rank{rank}" in state:
        torch.cuda.set_rng_state(state[f"rng/cuda/rank{rank}"], context.device())
    scaler = trainer.precision.scaler
    if scaler is not None and state.get("scaler"):
        scaler.scale.fill_(state["scaler"]["scale"])
        scaler.clean_steps = state["scaler"]["clean_steps"]
