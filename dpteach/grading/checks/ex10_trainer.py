"""Exercise 10's training, as one rank runs it: what a rank holds at step s, and the same run in one process.

The loop is ``SyncTrainer.step``'s (``dpteach/training/train.py``) with the course's ``zero1`` strategy
(``dpteach/sync/zero1.py``): each rank takes its B = 24 / W samples of the global batch, adds input noise
drawn from its own torch generator (seeded seed + rank, as ``TrainConfig(input_noise=...)`` does), runs
forward and backward, reduce-scatters the gradients, steps SGD with momentum on its own shard and
all-gathers the weights. Only the model is smaller - 38 thousand parameters instead of the MLP's million -
so that a grading of eight checks, three worlds each, takes seconds.

What a checkpoint must hold is exactly what a fresh run does not have (``dpteach/training/checkpoint.py``
says it at length): the weights, each rank's momentum shard, each rank's generator, the sampler's place
in the data, and the step. :meth:`Trainer.snapshot` reads those from a rank, so that the check can compare
a resumed run, right after ``load_checkpoint``, with the uninterrupted run at the same step; ``reference``
trains the uninterrupted run in one process, SGD written out, to hold the ranks' run to.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ... import validate
from ...replica.data import epoch_permutation, make_dataset, sample_batch, split_for_rank
from ...replica.timeline import Timeline
from ...sync import make_strategy

WIDTHS = (64, 192, 128, 10)  # the course's mlp data: 64 features, 10 classes
GLOBAL_BATCH = 24            # B x W for W = 1, 2, 3, 4
EPOCH = 3                    # global batches per epoch: step 4 is epoch 1, batch 1
LR, MOMENTUM, BUCKET_MB = 0.05, 0.9, 0.1  # 0.1 MB buckets: two flat groups

def build_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)  # the same weights on every rank, as build_model in dpteach.replica.models
    layers = []
    for a, b in zip(WIDTHS[:-1], WIDTHS[1:]):
        layers += [nn.Linear(a, b), nn.GELU()]
    return nn.Sequential(*layers[:-1])


class Sampler:
    """Where a run is in its data: epoch after epoch of ``EPOCH`` global batches, each epoch reshuffled from
    seed + epoch (``replica.data.epoch_permutation``). A fresh sampler starts at epoch 0, batch 0."""

    def __init__(self, seed: int):
        self.seed, self.epoch, self.batch = seed, 0, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batch": self.batch}

    def load_state_dict(self, state) -> None:
        if not isinstance(state, dict) or set(state) != {"epoch", "batch"}:
            raise validate.refusal("state", state, "give what state_dict() returned: a dict with 'epoch' and 'batch'")
        whole = {k: v.item() if isinstance(v, torch.Tensor) and v.numel() == 1 else v for k, v in state.items()}
        self.epoch = validate.integer("state['epoch']", whole["epoch"], low=0)
        self.batch = validate.integer("state['batch']", whole["batch"], low=0, high=EPOCH - 1)

    def next_batch(self) -> list:
        order = epoch_permutation(GLOBAL_BATCH * EPOCH, self.seed, self.epoch)
        batch = order[self.batch * GLOBAL_BATCH:(self.batch + 1) * GLOBAL_BATCH]
        self.epoch, self.batch = (self.epoch + 1, 0) if self.batch + 1 == EPOCH else (self.epoch, self.batch + 1)
        return batch


class Run:
    """What ``save_checkpoint`` and ``load_checkpoint`` are given: this rank's live run (the stub says what
    each attribute is)."""

    def __init__(self, model, optimizer, groups, sampler, rank: int, world: int):
        self.model, self.optimizer, self.groups, self.sampler = model, optimizer, groups, sampler
        self.rank, self.world = rank, world


class Trainer:
    """One rank's run: the model in ZeRO-1's flat groups, SGD over this rank's shards, the sampler, the noise.
    ``spec``: the run's ``ex10_runs.Scenario`` (its seed and its noise)."""

    def __init__(self, spec):
        rank, world = dist.get_rank(), dist.get_world_size()
        model = build_model(spec.seed)
        self.strategy = make_strategy("zero1", model, Timeline("cpu"), BUCKET_MB)
        optimizer = self.strategy.make_optimizer(lambda params: torch.optim.SGD(params, lr=LR, momentum=MOMENTUM))
        self.dataset, self.noise = make_dataset("mlp", GLOBAL_BATCH * EPOCH, seed=spec.seed), spec.noise
        torch.manual_seed(spec.seed + rank)  # each rank its own stream of noise
        self.run = Run(model, optimizer, self.strategy.groups, Sampler(spec.seed), rank, world)

    def step(self, step: int) -> None:
        run = self.run
        indices = split_for_rank(run.sampler.next_batch(), run.rank, run.world, GLOBAL_BATCH // run.world, 1)[0]
        x, y = sample_batch(self.dataset, indices)
        if self.noise:
            x = x + self.noise * torch.randn(x.shape)
        self.strategy.start_step(step)
        with self.strategy.micro_batch(sync=True):
            F.cross_entropy(run.model(x), y).backward()
        self.strategy.finish(step)
        self.strategy.step_optimizer(run.optimizer)

    def own_momentum_bytes(self) -> list[bytes]:
        """This rank's momentum, the unpadded part of its shard of each group, as the optimizer holds it (float32)."""
        pieces = []
        for group in self.strategy.groups:
            buffer = self._momentum_buffer(group)
            if isinstance(buffer, torch.Tensor) and buffer.dtype == torch.float32:
                pieces.append(buffer.detach()[:own_elements(group, self.run.rank)].contiguous().numpy().tobytes())
        return pieces

    def _momentum_buffer(self, group):
        """What the optimizer holds as ``group``'s momentum (None before the first step), whatever the learner put."""
        return getattr(self.run.optimizer, "state", {}).get(group.shard, {}).get("momentum_buffer")

    def weights(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.run.model.parameters()]).clone()

    def snapshot(self) -> dict:
        """What this rank holds now: the weights, the unpadded part of its momentum shard of each group (or what
        is wrong with it), its generator, its sampler's place, and whether the weights still live in the groups."""
        run, rank, problems, momentum = self.run, dist.get_rank(), [], []
        for index, group in enumerate(self.strategy.groups):
            n = group.shard_numel
            buffer = self._momentum_buffer(group)
            if buffer is None:  # none yet: the next step starts it from zero, as a fresh optimizer does
                momentum.append(None)
            elif not isinstance(buffer, torch.Tensor) or (buffer.shape, buffer.dtype) != (group.shard.shape,
                                                                                           group.shard.dtype):
                problems.append(f"group {index}'s momentum is {described(buffer)}, not a float32 tensor of the "
                                f"shard's shape ({n},)")
                momentum.append(None)
            else:
                momentum.append(buffer.detach()[:own_elements(group, rank)].clone())
        flat = {group.flat.untyped_storage().data_ptr() for group in self.strategy.groups}
        in_place = all(p.untyped_storage().data_ptr() in flat for p in run.model.parameters())
        sampler = run.sampler.state_dict() if isinstance(run.sampler, Sampler) else None
        return {"weights": self.weights(), "momentum": momentum, "problems": problems, "rng": torch.get_rng_state(),
                "sampler": None if sampler is None else [sampler["epoch"], sampler["batch"]], "in_place": in_place}


def written_whole(directory: str, pieces: list[bytes]) -> bool:
    """Whether every piece appears, byte for byte, in some file under ``directory``: a checkpoint holds a tensor's
    bytes as they are (torch.save, DCP and numpy all write a float32 tensor's raw bytes), so a file of the right
    size that does not hold them - zeros, noise - holds something else than the rank's state."""
    if not pieces:
        return False
    contents = []
    for folder, _, names in os.walk(directory):
        for name in names:
            try:
                with open(os.path.join(folder, name), "rb") as handle:
                    contents.append(handle.read())
            except OSError:
                continue
    return all(any(piece in content for content in contents) for piece in pieces)


def own_elements(group, rank: int) -> int:
    """How many of this rank's shard's elements are parameters, not padding."""
    numel, n = group.numel, group.shard_numel
    return max(0, min(n, numel - rank * n))


def described(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).replace('torch.', '')} tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


def reference(spec) -> torch.Tensor:
    """The uninterrupted run's final weights, in one process: every rank's noise from its own generator, the
    gradients averaged, SGD with momentum written out (as torch.optim.SGD does it)."""
    world = spec.before
    model = build_model(spec.seed)
    params = list(model.parameters())
    dataset, sampler = make_dataset("mlp", GLOBAL_BATCH * EPOCH, seed=spec.seed), Sampler(spec.seed)
    generators = [torch.Generator().manual_seed(spec.seed + rank) for rank in range(world)]
    buffers = [torch.zeros_like(p) for p in params]
    for _ in range(spec.steps):
        batch, grads = sampler.next_batch(), [torch.zeros_like(p) for p in params]
        for rank in range(world):
            x, y = sample_batch(dataset, split_for_rank(batch, rank, world, GLOBAL_BATCH // world, 1)[0])
            if spec.noise:
                x = x + spec.noise * torch.randn(x.shape, generator=generators[rank])
            model.zero_grad()
            F.cross_entropy(model(x), y).backward()
            for grad, p in zip(grads, params):
                grad += p.grad / world
        with torch.no_grad():
            for p, buffer, grad in zip(params, buffers, grads):
                buffer.mul_(MOMENTUM).add_(grad)
                p.sub_(LR * buffer)
    return torch.cat([p.detach().reshape(-1) for p in params])
