"""Exercise 10's three runs, each the body of one world's ranks: uninterrupted, killed, resumed - and the fault
plan a check gives them (``Scenario``: where and when the victim dies).

Each run trains as ``ex10_trainer.Trainer`` does (the course's ``zero1`` strategy on a small model); the killed
run calls the learner's ``save_checkpoint`` every ``every`` steps and ``load_checkpoint`` once at its start, the
resumed run ``load_checkpoint`` on another number of ranks. ``training_changed`` says whether the learner's
code changed any of the course modules the runs train with: they are pictured when the grader is imported.
"""
from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ... import validate
from ...ranks.faults import Fault
from ..spec import Fail
from .ex10_trainer import GLOBAL_BATCH, Trainer, own_elements, written_whole

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


@dataclass(frozen=True)
class Scenario:
    """A run of ``steps`` steps on ``before`` ranks, checkpointing every ``every`` steps, whose rank ``victim`` is
    killed, and resumed on ``after`` ranks with the same global batch. Where the kill strikes (``strike``):

    * ``"step"``: just before step ``kill``, between two checkpoints;
    * ``"before save"``: after ``kill`` steps, just before the victim's save of that checkpoint, while its peers
      write theirs: the checkpoint of step ``kill`` is never whole;
    * ``"in save"``: in the middle of the victim's save of step ``kill``, at half the file writes its save of the
      checkpoint before made (``ex10_observed.saving``): some of its files exist, some do not, one may be cut short.

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


def _step_from(value, steps: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= steps:
        raise Fail(f"load_checkpoint returned {value!r} {what}: return the step of the checkpoint it loaded, "
                   f"an int (0 when the folder holds none)")
    return value


# --- the three runs: each is the body of one world's ranks (``grading/forked_worlds.run_world``), send first ----------

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
                           "shard": sum(own_elements(g, trainer.run.rank) for g in trainer.strategy.groups) * 4,
                           "holds": written_whole(directory, trainer.own_momentum_bytes())})


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


