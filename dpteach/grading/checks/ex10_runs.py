"""Exercise 10's training run: what a rank holds at step s, the loop that calls the learner's save and load,
and the three runs a check compares - uninterrupted, killed, resumed.

The loop is ``SyncTrainer.step``'s (``dpteach/training/train.py``) with the course's ``zero1`` strategy
(``dpteach/sync/zero1.py``): each rank takes its B = 24 / W samples of the global batch, adds input noise
drawn from its own torch generator (seeded seed + rank, as ``TrainConfig(input_noise=...)`` does), runs
forward and backward, reduce-scatters the gradients, steps SGD with momentum on its own shard and
all-gathers the weights. Only the model is smaller - 38 thousand parameters instead of the MLP's million -
so that a grading of eight checks, three worlds each, takes seconds.

What a checkpoint must hold is exactly what a fresh run does not have (``dpteach/training/checkpoint.py``
says it at length): the weights, each rank's momentum shard, each rank's generator, the sampler's place
in the data, and the step. :meth:`Trainer.snapshot` reads those from a rank, so that the check can compare
a resumed run, right after ``load_checkpoint``, with the uninterrupted run at the same step.
"""
from __future__ import annotations

import inspect
import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ... import validate
from ...ranks.faults import Fault
from ...replica.data import epoch_permutation, make_dataset, sample_batch, split_for_rank
from ...replica.timeline import Timeline
from ...sync import make_strategy
from ..spec import Fail

WIDTHS = (64, 192, 128, 10)  # the course's mlp data: 64 features, 10 classes
GLOBAL_BATCH = 24            # B x W for W = 1, 2, 3, 4
EPOCH = 3                    # global batches per epoch: step 4 is epoch 1, batch 1
LR, MOMENTUM, BUCKET_MB = 0.05, 0.9, 0.1  # 0.1 MB buckets: two flat groups
STRIKES = ("step", "before save", "in save")  # where the victim dies (Scenario)


# The course's modules the runs train with. The seal pictures the grader's own modules and torch's (seal.py),
# not these; so they are pictured here, when the grader is imported, before any learner code runs. (torch.optim
# is left out: torch wraps an optimizer's step itself on first use.)
TRAINS_WITH = ("dpteach.sync.zero1", "dpteach.sync.sharding", "dpteach.sync.base", "dpteach.network.comm",
               "dpteach.replica.data", "dpteach.replica.buckets", "dpteach.replica.timeline", "dpteach.ranks.faults")


# What Python itself adds to a module or class in passing: warnings' registry, and the cache copyreg keeps on a
# class the first time one of its instances is pickled (a Fault sent to a rank, in any earlier run).
PYTHONS_OWN = ("__warningregistry__", "__slotnames__")


def _picture() -> dict:
    found = {}
    for name in TRAINS_WITH:
        members = vars(sys.modules[name])
        found[name] = dict(members)
        found.update({f"{name}.{value.__qualname__}": dict(vars(value)) for value in list(members.values())
                      if inspect.isclass(value) and value.__module__ == name})
    return found


_TRAINING = _picture()


def training_changed() -> list:
    """What of the modules the runs train with is not what it was before the learner's code was loaded."""
    now = _picture()
    return sorted(f"{space}.{key}" for space, before in _TRAINING.items()
                  for key in before.keys() | now.get(space, {}).keys() if key not in PYTHONS_OWN
                  and before.get(key, before) is not now.get(space, {}).get(key, before))


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


@dataclass(frozen=True)
class Scenario:
    """A run of ``steps`` steps on ``before`` ranks, checkpointing every ``every`` steps, whose rank ``victim`` is
    killed, and resumed on ``after`` ranks with the same global batch. Where the kill strikes (``strike``):

    * ``"step"``: just before step ``kill``, between two checkpoints;
    * ``"before save"``: after ``kill`` steps, just before the victim's save of that checkpoint, while its peers
      write theirs: the checkpoint of step ``kill`` is never whole;
    * ``"in save"``: in the middle of the victim's save of step ``kill``, at half the file writes its save of the
      checkpoint before made (``ex10_story.saving``): some of its files exist, some do not, one may be cut short.

    A checkpoint counts as written whole only once every rank's save of it has returned."""

    before: int
    after: int
    every: int
    kill: int
    steps: int
    noise: float = 0.0
    seed: int = 0
    victim: int = 1
    strike: str = "step"

    def check(self) -> "Scenario":
        for name in ("before", "after"):
            validate.integer(name, getattr(self, name), low=1, high=4)
            if GLOBAL_BATCH % getattr(self, name):
                raise validate.refusal(name, getattr(self, name), f"W must divide the global batch of {GLOBAL_BATCH}")
        validate.integer("steps", self.steps, low=2)
        validate.integer("every", self.every, low=1, high=self.steps - 1)
        validate.choice("strike", self.strike, STRIKES)
        in_save = self.strike != "step"
        validate.integer("kill", self.kill, low=self.every * (2 if in_save else 1), high=self.steps - 1,
                         why=" (a whole checkpoint before it, and a step after it)")
        if in_save and self.kill % self.every:
            raise validate.refusal("kill", self.kill, f"a kill in a save strikes at a checkpoint: a multiple of "
                                                      f"every={self.every}")
        if not in_save and self.kill % self.every == 0:
            raise validate.refusal("kill", self.kill, f"kill between two checkpoints, not on one (every={self.every}), "
                                                      f"or say strike='before save' or 'in save'")
        validate.number("noise", self.noise, low=0)
        validate.integer("victim", self.victim, low=0, high=self.before - 1)
        if self.noise and self.before != self.after:
            raise validate.refusal("noise", self.noise, "use 0.0 when W changes: rank r's noise stream exists only "
                                                        "if rank r does, so no resume at another W could match")
        return self

    @property
    def resume_at(self) -> int:
        """The newest checkpoint written whole before the kill: where the resumed run must start."""
        if self.strike != "step":
            return self.kill - self.every  # the checkpoint being written when the victim died is not whole
        return self.kill // self.every * self.every


class Trainer:
    """One rank's run: the model in ZeRO-1's flat groups, SGD over this rank's shards, the sampler, the noise."""

    def __init__(self, spec: Scenario):
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
                pieces.append(buffer.detach()[:_own(group, self.run.rank)].contiguous().numpy().tobytes())
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
                problems.append(f"group {index}'s momentum is {_described(buffer)}, not a float32 tensor of the "
                                f"shard's shape ({n},)")
                momentum.append(None)
            else:
                momentum.append(buffer.detach()[:_own(group, rank)].clone())
        flat = {group.flat.untyped_storage().data_ptr() for group in self.strategy.groups}
        in_place = all(p.untyped_storage().data_ptr() in flat for p in run.model.parameters())
        sampler = run.sampler.state_dict() if isinstance(run.sampler, Sampler) else None
        return {"weights": self.weights(), "momentum": momentum, "problems": problems, "rng": torch.get_rng_state(),
                "sampler": None if sampler is None else [sampler["epoch"], sampler["batch"]], "in_place": in_place}


def _written(directory: str, pieces: list[bytes]) -> bool:
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


def _own(group, rank: int) -> int:
    """How many of this rank's shard's elements are parameters, not padding."""
    numel, n = group.numel, group.shard_numel
    return max(0, min(n, numel - rank * n))


def _described(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).replace('torch.', '')} tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


def _step_from(value, steps: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= steps:
        raise Fail(f"load_checkpoint returned {value!r} {what}: return the step of the checkpoint it loaded, "
                   f"an int (0 when the folder holds none)")
    return value


# --- the three runs: each is the body of one world's ranks (``ex10_worlds.run_world``), send first ----------

def plain(send, spec: Scenario) -> dict:
    """The uninterrupted run, all grader: what each rank holds at the resume step, and the final weights."""
    trainer = Trainer(spec)
    at = None
    for step in range(spec.steps):
        trainer.step(step)
        if step + 1 == spec.resume_at:
            at = trainer.snapshot()
    dist.barrier()
    return {"at": at, "final": trainer.weights()}


def killed(send, spec: Scenario, directory: str, save, load) -> None:
    """The run that dies: it loads (an empty folder: step 0), saves every ``every`` steps, and its victim is
    killed where ``spec.strike`` says; its peers never get past the next collective. ``save(run, directory,
    step, strike_at, strike)`` returns (bytes written, bytes received, file writes made); given ``strike_at`` n,
    it calls ``strike`` at the save's n-th file write (0: before the save starts)."""
    trainer = Trainer(spec)
    _step_from(load(trainer.run, directory), 0, "on an empty folder, for a run that had never saved")
    fault = Fault("kill", rank=spec.victim, step=spec.kill)
    victim, writes = trainer.run.rank == spec.victim, 0

    def strike():
        send("strike")
        fault.strike()

    for step in range(spec.steps):
        if spec.strike == "step" and fault.due(step, trainer.run.rank):
            strike()
        trainer.step(step)
        if (step + 1) % spec.every == 0:
            strike_at = None
            if victim and spec.strike != "step" and step + 1 == spec.kill:
                strike_at = 0 if spec.strike == "before save" else (writes + 1) // 2
            *wrote, writes = save(trainer.run, directory, step + 1, strike_at, strike)
            send("saved", {"step": step + 1, "bytes": tuple(wrote), "model": trainer.weights().numel() * 4,
                           "shard": sum(_own(g, trainer.run.rank) for g in trainer.strategy.groups) * 4,
                           "holds": _written(directory, trainer.own_momentum_bytes())})


def resumed(send, spec: Scenario, directory: str, load) -> dict:
    """A fresh run on ``after`` ranks: load, what it holds right after, and - if every rank resumed from the
    same step and holds a usable state - the steps that were left."""
    trainer = Trainer(spec)
    start = _step_from(load(trainer.run, directory), spec.steps, "")
    loaded = trainer.snapshot()
    mine = torch.tensor([start, int(not loaded["problems"])])
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)  # all ranks go on, or none: a lone rank would wait for the others forever
    final = None
    if all(int(t[0]) == spec.resume_at and int(t[1]) for t in every):
        try:
            for step in range(start, spec.steps):
                trainer.step(step)
        except Exception as exc:  # noqa: BLE001 - what the loaded state broke is the learner's to see
            raise Fail(f"after load_checkpoint returned, the run could not go on: {type(exc).__name__}: "
                       f"{str(exc).splitlines()[0][:200]}") from None
        final = trainer.weights()
    dist.barrier()
    return {"from": start, "loaded": loaded, "final": final}


def reference(spec: Scenario) -> torch.Tensor:
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
