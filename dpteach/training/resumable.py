"""A training run that survives its own death: checkpoint every N steps, resume from the newest one.

The loop is ``train.py``'s, with two additions, read top to bottom::

    trainer = SyncTrainer(config)                       # fresh weights, fresh optimizer, fresh generators
    if a complete checkpoint exists:                    # a restart (torchrun's, or the learner's)
        load it in place                                # weights, optimizer, RNG, sampler, scaler, step s
    for step in s .. steps-1:
        (a fault strikes here, if one is planned)
        trainer.step(step)
        every N steps: save a checkpoint                # every rank writes its part; complete, or absent

Run under ``torchrun --max-restarts 1`` with a fault planned, a rank dies, torchrun stops the others and
starts all W workers again (``TORCHELASTIC_RESTART_COUNT`` becomes 1; the fault, planned for the first
attempt only, does not strike again); each finds the checkpoint and goes on. The steps between that
checkpoint and the fault are done twice: that is the work a failure costs, and the checkpoint interval
(``interval.py``) is how much of it one is willing to lose.

A resume at another W keeps the global batch B x W x K: the data order (``replica/data.py``) depends on
it, so the resumed run must draw the same global batches. Only the generators cannot follow a change of
W: rank r's stream exists only if rank r did (``checkpoint.load_checkpoint`` says so).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch.distributed as dist

from .. import validate
from ..ranks.faults import Fault, restart_count
from ..replica.build import step_batches
from ..replica.timeline import start_together
from .checkpoint import check_leave_out, check_resumable, latest_checkpoint, load_checkpoint, save_checkpoint
from .train import SyncTrainer, TrainConfig


@dataclass
class Checkpointing:
    """Where and how often a run checkpoints, and which pieces a resume leaves out (``checkpoint.PIECES``)."""

    directory: str
    every: int = 1
    leave_out: tuple = field(default_factory=tuple)
    keep: int = 2

    def check(self) -> "Checkpointing":
        if not isinstance(self.directory, str) or not self.directory:
            raise validate.refusal("checkpoint directory", self.directory, "give a folder's path as a string")
        validate.integer("every", self.every, low=1)
        validate.integer("keep", self.keep, low=1)
        self.leave_out = check_leave_out(self.leave_out)
        return self


def check_run(config: TrainConfig, checkpointing: Checkpointing, fault: Fault | None, world_size: int) -> None:
    """Everything checked before a rank starts."""
    config.check(world_size)
    check_resumable(config.strategy)
    checkpointing.check()
    if fault is not None:
        fault.check(world_size, config.steps)


def resume(trainer: SyncTrainer, checkpointing: Checkpointing) -> dict:
    """Load the newest complete checkpoint, if any, into ``trainer``; say what was resumed."""
    latest = latest_checkpoint(checkpointing.directory)
    if latest is None:
        return {"resumed_from": 0, "restored": [], "saved_world_size": None}
    step, path = latest
    loaded = load_checkpoint(trainer, path, checkpointing.leave_out)
    saved = loaded["progress"]
    config = trainer.config
    if saved["global_batch"] != config.global_batch(trainer.world):
        raise ValueError(f"batch_per_rank={config.batch_per_rank!r} is not allowed for this resume: the checkpoint "
                         f"at {path} was trained on global batches of {saved['global_batch']} samples, and "
                         f"{config.batch_per_rank} x {trainer.world} ranks x {config.accum_steps} = "
                         f"{config.global_batch(trainer.world)}; keep B x W x K the same (the data order depends on it)")
    drawn = loaded["data"]["batches_drawn"] if loaded["data"] else 0  # left out: the sampler starts over
    trainer.batches = step_batches(config, trainer.dataset, trainer.world, start=drawn)
    return {"resumed_from": step, "restored": loaded["restored"], "saved_world_size": saved["world_size"]}


def train_resumable_on_rank(config: TrainConfig, checkpointing: Checkpointing, fault: Fault | None = None,
                            stop_after: int | None = None) -> dict:
    """Train ``config`` on this rank, resuming from and writing to ``checkpointing.directory``.

    ``fault`` strikes as planned; ``stop_after`` ends the run quietly after that many steps (an
    interruption without a death, for comparisons inside one launch). Returns the summary of
    ``train.SyncTrainer`` plus ``resumed_from``, ``restarts``, ``restored`` and the checkpoints written.
    """
    trainer = SyncTrainer(config)
    resumed = resume(trainer, checkpointing)
    start_together(trainer.timeline)
    rank, saves = dist.get_rank(), []
    last = config.steps if stop_after is None else min(config.steps, stop_after)
    for step in range(resumed["resumed_from"], last):
        if fault is not None and fault.due(step, rank):
            fault.strike()
        trainer.step(step)
        done = step + 1
        if done % checkpointing.every == 0 or done == config.steps:
            saves.append(save_checkpoint(trainer, checkpointing.directory, done, checkpointing.keep))
    summary = trainer.summary()
    summary.update(resumed, restarts=restart_count(), checkpoints=saves)
    return summary
