"""What every trainer sets up on a rank, and what it reports when it is done.

Both ways the course trains - in lockstep (``dpteach.training.train``: every rank takes step s together) and
with a parameter server (``sync/async_ps.py``: no step is shared) - start a rank the same way and
end it the same way, so that their results can be laid side by side:

* :func:`build_replica`: the model with rank 0's initial weights on every rank (DDP broadcasts
  them too, in its constructor), the dataset drawn from the seed, and the loss;
* :func:`make_optimizer` and :func:`step_batches`: the optimizer and the global batch of every
  step, exactly as the single-process reference (``dpteach/training/reference.py``) builds them;
* :func:`summarise`: losses, step times, bytes sent, the timeline, and how far the replicas drifted
  apart (:func:`replica_spread`, 0.0 exactly when every rank holds the same weights).
"""
from __future__ import annotations

import statistics
from dataclasses import asdict

import torch
import torch.distributed as dist
from torch.nn.utils import parameters_to_vector

from ..ranks import context
from .data import global_batches, loss_fn, make_dataset, sample_batch
from .models import DEFAULT_LR, build_model
from .timeline import step_accounting

OPTIMIZERS = ("sgd", "adam", "muon")
ADAM_LR = 1e-3  # SGD's default learning rate is the model's own (dpteach.replica.models.DEFAULT_LR)
MUON_LR = 0.02  # the learning rate of Keller Jordan's Muon reference (KellerJordan/Muon, muon.py)


def make_optimizer(config, params):
    """SGD with momentum, Adam, or Muon, as ``config.optimizer`` says, at ``config.lr`` or the default."""
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=config.lr or DEFAULT_LR[config.model], momentum=config.momentum)
    if config.optimizer == "muon":
        return MuonForMatrices(list(params), lr=config.lr or MUON_LR, other_lr=DEFAULT_LR[config.model],
                               momentum=config.momentum)
    return torch.optim.Adam(params, lr=config.lr or ADAM_LR)


class MuonForMatrices:
    """torch's ``Muon`` for the 2-D weights and SGD with momentum for everything else (biases, norms): Muon
    orthogonalises a matrix's update, which means nothing for a vector (Jordan's Muon and torch's own refuse
    them too). Weight decay 0, as the course's SGD; torch's defaults otherwise (momentum 0.95, Nesterov, five
    Newton-Schulz steps). Offers what the trainer uses of an optimizer: ``step``, ``zero_grad``, ``state``,
    ``param_groups``, ``state_dict``."""

    def __init__(self, params, lr: float, other_lr: float, momentum: float):
        matrices = [p for p in params if p.ndim == 2]
        rest = [p for p in params if p.ndim != 2]
        self.parts = ([torch.optim.Muon(matrices, lr=lr, weight_decay=0.0)] if matrices else []) + (
            [torch.optim.SGD(rest, lr=other_lr, momentum=momentum)] if rest else [])

    def step(self, closure=None):
        for part in self.parts:
            part.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for part in self.parts:
            part.zero_grad(set_to_none=set_to_none)

    @property
    def state(self) -> dict:
        return {p: s for part in self.parts for p, s in part.state.items()}

    @property
    def param_groups(self) -> list:
        return [g for part in self.parts for g in part.param_groups]

    def state_dict(self) -> dict:
        return {"parts": [part.state_dict() for part in self.parts]}

    def load_state_dict(self, state: dict) -> None:
        for part, saved in zip(self.parts, state["parts"]):
            part.load_state_dict(saved)


def step_batches(config, dataset, world_size: int, start: int = 0):
    """The global batch of every step, epoch after epoch (each epoch reshuffled from seed + epoch), from
    the ``start``-th on: a run resumed after ``start`` steps draws exactly what it would have drawn next."""
    epoch, drawn = 0, 0
    while True:
        for batch in global_batches(dataset, config.batch_per_rank, world_size, config.accum_steps,
                                    config.seed, epoch):
            if drawn >= start:
                yield batch
            drawn += 1
        epoch += 1


def build_replica(config):
    """This rank's model (rank 0's initial weights on every rank), its dataset and its loss function."""
    model = build_model(config.model, seed=config.seed, device=context.device())
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    dataset = make_dataset(config.model, config.dataset_size(dist.get_world_size()), seed=config.seed)
    return model, dataset, loss_fn(config.model)


def forward_backward(model, criterion, dataset, micro_batches, timeline, step: int, accum_steps: int) -> None:
    """Forward and backward over one step's micro-batches (lists of sample indices), each loss divided by
    ``accum_steps`` so that the gradients add up to the step's mean, drawn on ``timeline`` - for a strategy
    that runs a loop of its own (the lockstep trainer's loop is ``train.SyncTrainer.step``)."""
    device = context.device()
    for indices in micro_batches:
        x, y = (t.to(device) for t in sample_batch(dataset, indices))
        with timeline.span(step, "forward"):
            loss = criterion(model(x), y) / accum_steps
        with timeline.span(step, "backward"):
            loss.backward()


def summarise(config, model, losses, step_times, wire_bytes, timeline, hook_calls=None,
              average_losses: bool = True) -> dict:
    """Plain data every trainer returns; ``average_losses`` averages each step's loss over the ranks
    (in lockstep each rank's loss is the mean over its own shard of the same global batch)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    loss_tensor = torch.tensor(losses, dtype=torch.float64)
    if average_losses:
        dist.all_reduce(loss_tensor)
        loss_tensor /= world
    flat = flat_weights(model)
    spread = replica_spread(flat)
    timed = step_times[config.timing_warmup:] or step_times
    accounting = step_accounting(timeline.spans, range(min(config.timing_warmup, len(step_times) - 1),
                                                       len(step_times)))
    return {
        "rank": rank, "config": asdict(config), "losses": loss_tensor.tolist(), "step_times": step_times,
        "median_step_s": statistics.median(timed) if timed else 0.0,
        "median_exposed_s": accounting["exposed_s"], "median_overhead_s": accounting["overhead_s"],
        "wire_bytes_per_step": statistics.mean(wire_bytes) if wire_bytes else 0.0, "wire_bytes": list(wire_bytes),
        "replica_spread": spread, "spans": timeline.spans, "clock_origin_s": timeline.origin, "hook_calls": hook_calls,
        "params": flat if rank == 0 else None,
    }


def flat_weights(model) -> torch.Tensor:
    """Every parameter of ``model`` in one float32 vector on the CPU (a sharded DTensor whole: a collective)."""
    return parameters_to_vector([p.full_tensor() if hasattr(p, "full_tensor") else p
                                 for p in model.parameters()]).detach().to("cpu", torch.float32)


def replica_spread(flat: torch.Tensor) -> float:
    """max |theta_r - theta_0| over all ranks r: 0.0 exactly when every replica is identical."""
    reference = flat.clone()
    dist.broadcast(reference, src=0)
    spread = torch.tensor([(flat - reference).abs().max().item()])
    dist.all_reduce(spread, op=dist.ReduceOp.MAX)
    return spread.item()
