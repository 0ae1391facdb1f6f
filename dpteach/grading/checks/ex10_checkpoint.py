"""Exercise 10: checkpoint and resume - a ZeRO-1 run killed for real goes on as if nothing had happened.

The learner writes ``save_checkpoint(run, directory, step)`` and ``load_checkpoint(run, directory)`` for a
run that uses the course's ZeRO-1 (``dpteach/sync/zero1.py``). Each check is one story on real ranks
(``ex10_observed.py``, on the worlds of ``grading/forked_worlds.py``): the run trains uninterrupted; the same run trains
again, calling the learner's save every few steps, until one of its ranks is killed with SIGKILL; a fresh
run - on the same W, or another with the same global batch - calls the learner's load and trains to the
end. The resumed run is then compared, right after its load and at the end, with the uninterrupted one
(what a rank holds: ``ex10_trainer.py``; the runs themselves: ``ex10_runs.py``).

**One check per piece, so that a forgotten piece names itself.** At the same W the end must be equal
exactly (max |difference| 0.0): the same ranks add the same numbers in the same order. A checkpoint that
forgets the momentum, the generators or the sampler's place ends differently, and the end-to-end checks
fail with it - but the check for that piece says which it was, and each end-to-end failure names the
first piece that differed right after loading. At another W the reduce-scatter adds in another order,
so the end is equal within the rounding allowed to exact strategies (``reference.SGD_TOLERANCE``).

**A checkpoint counts once it is whole.** The visible checks kill a rank between two checkpoints; the hidden
two kill one inside a save - just before its own save while its peers write theirs, and in the middle of it,
at half the file writes its previous save made (``ex10_runs.Scenario``'s ``strike``). The checkpoint being
written is then not whole, and the resumed run must start from the one before. A save that marks a
checkpoint complete before every rank has written its part passes every visible check and fails these.

**Who writes what is measured, not asked.** Around each save, the kernel says how many bytes each rank
wrote to files and how many reached it through its sockets (``ex10_observed.bytes_out``). Every rank must
write at least half its own momentum shard; none may write the model, its own shard and half the others'
besides (one rank writing everything); and none may receive half of its peers' shards during a save
(the shards gathered to one rank, whoever writes the files then). Gathering to rank 0 is the mistake
ZeRO exists to avoid. Bytes alone are not enough: after each save, each rank's momentum shard, as its float32
bytes, must be found in some file of the folder (files of zeros of the right size hold something else).

**Nothing to copy from.** The uninterrupted run is trained after the learner's ranks are forked
(``ex10_observed.observed``); the audit hook reports a frame reached through the standard library.
**The runs are trusted only as far as they are checked**: the uninterrupted run must match a single-process
replay (``ex10_trainer.reference``), in the rank and again in the judge, and the course's modules the runs
train with must be unchanged after every call of the learner's code (``ex10_runs.training_changed``).
"""
from __future__ import annotations

import shutil
import tempfile
from functools import partial

import torch

from ...training.reference import SGD_TOLERANCE
from ..spec import Check, Exercise, Fail
from .ex10_runs import Scenario
from .ex10_trainer import Sampler, reference
from .ex10_observed import observed

STUB = '''\
import os
import torch
import torch.distributed as dist


def save_checkpoint(run, directory, step):
    """Write into the folder `directory` what this rank's run needs to go on after `step` steps.

    Called on every rank of the run, every few steps. `run` is this rank's live run:
      run.model      the model; every rank holds the same weights
      run.groups     ZeRO-1's flat groups (dpteach.sync.sharding.FlatGroup): group.params live in one
                     buffer, group.flat, padded to a multiple of W; group.shard is this rank's piece of
                     it, group.flat[rank * n:(rank + 1) * n] with n = group.shard_numel
      run.optimizer  torch.optim.SGD with momentum over the shards only: this rank's momentum for a
                     group is run.optimizer.state[group.shard]["momentum_buffer"], of the shard's shape
      run.sampler    where the run is in its data: run.sampler.state_dict(), run.sampler.load_state_dict()
      run.rank, run.world
    Each rank also draws input noise from torch's default generator (torch.get_rng_state()).
    Every rank writes its own part: no rank writes, or gathers, the whole optimizer state.
    """
    raise NotImplementedError("your code here")


def load_checkpoint(run, directory):
    """Put the newest complete checkpoint in `directory` into this fresh run, in place, and return its
    step - or return 0 when the folder holds none.

    Called on every rank of a new run, which may have another W than the one that saved (the global
    batch is the same): its groups hold the same parameters, cut into W new shards.
    """
    raise NotImplementedError("your code here")
'''

HINT_RESUME = ("Find the newest checkpoint whose every part was written, return its step, and copy the weights "
               "into the model in place (run.model.load_state_dict, or p.copy_): the parameters are views into the "
               "flat groups, and rebinding them cuts them off.")
HINT_WHOLE = ("A rank can die while the others save, or in the middle of its own save: that checkpoint is then not "
              "whole. Mark a checkpoint complete only once every rank has written its part (each rank's own marker "
              "written after its files, or one written after a barrier), write each file under a temporary name "
              "and rename it, and on load take the newest checkpoint that is complete.")
HINT_MOMENTUM = ("Save each rank's momentum shard, run.optimizer.state[group.shard]['momentum_buffer'], and put it "
                 "back into the fresh optimizer's state on load: a fresh optimizer starts its momentum from zero.")
HINT_RNG = ("Save each rank's generator, torch.get_rng_state(), and restore it with torch.set_rng_state(): a fresh "
            "run seeds every rank anew, so the input noise after the resume would repeat the first steps' noise.")
HINT_SAMPLER = ("Save run.sampler.state_dict() and restore it with run.sampler.load_state_dict(): a fresh sampler "
                "starts at epoch 0, batch 0, and the resumed run would train on the first batches again.")
HINT_RESHARD = ("At another W the shards are cut differently: rebuild each group's whole momentum, unpadded, from "
                "the pieces every old rank saved, and cut this rank's new piece (group.shard_numel elements, zeros "
                "after the end) - or save each shard as a DTensor of the group's true length and let "
                "torch.distributed.checkpoint reshard it.")
HINT_WRITES = ("Let every rank write its own shard - a file of its own, or torch.distributed.checkpoint with each "
               "shard as a DTensor: gathering the optimizer state to rank 0 makes one rank hold, and write, all of it.")
PIECES = (("weights", "the weights differ from the uninterrupted run's at that step", HINT_RESUME),
          ("momentum", "the momentum differs from the uninterrupted run's at that step", HINT_MOMENTUM),
          ("sampler", "the sampler is not where the uninterrupted run's was at that step", HINT_SAMPLER),
          ("rng", "a rank's random generator is not where it was at that step", HINT_RNG))


def _gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item() if a.shape == b.shape else float("inf")


def _differs(piece: str, plain: dict, back: dict) -> bool:
    if piece == "weights":
        return not (back["agree"] and _gap(back["weights"], plain["weights"]) == 0.0)
    if piece == "momentum":
        return back["momentum"] is None or _gap(back["momentum"], plain["momentum"]) != 0.0
    if piece == "sampler":
        return any(s != plain["sampler"][0] for s in back["sampler"])
    common = range(min(len(plain["rng"]), len(back["rng"])))  # rank r's stream exists only if rank r does
    return any(not torch.equal(back["rng"][r], plain["rng"][r]) for r in common)


def resume_case(ctx, props, spec: Scenario):
    seen = ctx.drive(observed, spec)
    plain, back = seen["plain"], seen["resumed"]
    if _gap(plain["final"], reference(spec)) > SGD_TOLERANCE:
        raise Fail("the uninterrupted run did not train as the course's ZeRO-1 does: the tools the grader trains "
                   "with were changed, so nothing can be compared")
    wrong = [f"rank {r} returned {s}" for r, s in enumerate(back["from"]) if s != spec.resume_at]
    if wrong:
        partial = (f"; the checkpoint of step {spec.kill} was being written when rank {spec.victim} was killed, so it "
                   f"is not whole" if spec.strike != "step" else "")
        raise Fail(f"load_checkpoint did not resume from the newest checkpoint, written after step {spec.resume_at} "
                   f"({', '.join(wrong)}){partial}: find the newest checkpoint that was written whole",
                   hint=HINT_WHOLE if spec.strike != "step" else HINT_RESUME)
    if back["problems"]:
        more = f"; and {len(back['problems']) - 2} more" if len(back["problems"]) > 2 else ""
        raise Fail("the optimizer state you restored cannot be used: " + "; ".join(back["problems"][:2]) + more,
                   HINT_RESHARD if spec.after != spec.before else HINT_MOMENTUM)
    if "weights" in props:
        _weights(plain, back)
    if "momentum" in props:
        _momentum(plain, back, spec)
    if "rng" in props and _differs("rng", plain, back):
        raise Fail("right after load_checkpoint, a rank's random generator is not where it was when the checkpoint "
                   "was written: the input noise after the resume differs from the uninterrupted run's", HINT_RNG)
    if "sampler" in props and _differs("sampler", plain, back):
        how = ("is back at epoch 0, batch 0: it started over" if [0, 0] in back["sampler"] else
               "is not where the run stopped")
        raise Fail(f"right after load_checkpoint, the sampler {how}, so the resumed run trains on other batches "
                   f"than the uninterrupted one", HINT_SAMPLER)
    if "end" in props:
        _end(plain, back, spec)


def _weights(plain, back) -> None:
    if not back["in_place"]:
        raise Fail("after load_checkpoint, some parameters no longer live in ZeRO-1's flat groups, so the steps "
                   "after it cannot update them: copy the weights in place, do not rebind p.data or replace the "
                   "parameters", HINT_RESUME)
    if not back["agree"]:
        raise Fail("after load_checkpoint, the ranks hold different weights: every rank loads the same ones",
                   HINT_RESUME)
    gap = _gap(back["weights"], plain["weights"])
    if gap != 0.0:
        raise Fail(f"right after load_checkpoint, the weights differ from the uninterrupted run's at the same step "
                   f"(max |difference| {gap:.3g}): every weight must come back exactly", HINT_RESUME)


def _momentum(plain, back, spec) -> None:
    if back["momentum"] is None:
        raise Fail("right after load_checkpoint, the optimizer holds no momentum for some shard: the optimizer "
                   "state was not restored, and the next step would start its momentum from zero", HINT_MOMENTUM)
    gap = _gap(back["momentum"], plain["momentum"])
    if gap != 0.0:
        raise Fail(f"right after load_checkpoint, the momentum differs from the uninterrupted run's at the same step "
                   f"(max |difference| {gap:.3g})", HINT_RESHARD if spec.after != spec.before else HINT_MOMENTUM)


def _end(plain, back, spec) -> None:
    same = spec.after == spec.before
    limit = 0.0 if same else SGD_TOLERANCE
    gap = float("inf") if back["final"] is None else _gap(back["final"], plain["final"])
    if gap <= limit:
        return
    ends = ("the resumed run ends with other weights than the uninterrupted run" +
            (f" (max |difference| {gap:.3g}, allowed {limit:g})" if gap != float("inf") else ""))
    for piece, what, hint in PIECES:
        if piece == "momentum" and back["momentum"] is None:
            raise Fail(f"{ends}: right after load_checkpoint, the optimizer held no momentum for some shard", hint)
        if _differs(piece, plain, back):
            raise Fail(f"{ends}: right after load_checkpoint, {what}",
                       HINT_RESHARD if piece == "momentum" and not same else hint)
    raise Fail(f"{ends}, although everything compared right after loading was right: is something else of the run "
               f"left changed by your save or load?", HINT_RESUME)


def writes_case(ctx, spec: Scenario):
    seen = ctx.drive(observed, spec, False)
    shards, model = seen["shard_bytes"], seen["model_bytes"]
    optimizer = sum(shards)
    kb = lambda n: f"{n / 1024:.0f} KiB"  # noqa: E731
    if not seen["saves"]:
        raise Fail("no rank reported a save before the kill", HINT_WRITES)
    for step, measured in seen["saves"]:
        if any(m is None or m[0] is None for m in measured):
            continue  # no /proc here: this machine cannot say what a process wrote
        for rank, (wrote, received) in enumerate(measured):
            others = optimizer - shards[rank]
            if received > others / 2:
                raise Fail(f"saving after step {step}, rank {rank} received {kb(received)} from its peers, more than "
                           f"half of their momentum shards ({kb(others)}): the optimizer state was gathered to it",
                           HINT_WRITES)
            if wrote > model + shards[rank] + others / 2:
                raise Fail(f"saving after step {step}, rank {rank} wrote {kb(wrote)} to disk, more than the whole "
                           f"model ({kb(model)}) and its own momentum shard ({kb(shards[rank])}) together: it wrote "
                           f"other ranks' optimizer state too", HINT_WRITES)
        if all(wrote == 0 for wrote, _ in measured):
            raise Fail(f"saving after step {step}, no rank wrote anything to disk: save_checkpoint must write this "
                       f"rank's part of the run into files in the folder it is given", HINT_WRITES)
        for rank, (wrote, _) in enumerate(measured):
            if wrote < shards[rank] / 2:
                raise Fail(f"saving after step {step}, rank {rank} wrote {kb(wrote)} to disk, not even half its own "
                           f"momentum shard ({kb(shards[rank])}), while another rank wrote more: its optimizer state "
                           f"left through another rank", HINT_WRITES)
    for step, found in seen["holds"]:  # how much was written is not enough: it must be what the ranks hold
        for rank, holds in enumerate(found):
            if holds is False:
                raise Fail(f"after the save of step {step}, no file in the folder holds rank {rank}'s momentum shard "
                           f"as the optimizer holds it (its float32 bytes): what was written is not the run's state",
                           HINT_WRITES)


def _warmup() -> None:
    """What a run imports on first use - torch.optim (torch._dynamo with it), and what DCP and DTensor import
    when they first save and load (fsspec, which reaches for ctypes as it loads) - imported once, before the
    seal and before any fork: not in every child, and not as if the learner's code had asked for it."""
    import torch.distributed.checkpoint as dcp
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    folder = tempfile.mkdtemp(prefix="dpteach-warmup-")
    try:
        mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
        state = {"t": DTensor.from_local(torch.zeros(2), mesh, [Shard(0)]), "n": 1, "s": Sampler(0)}
        dcp.save(state, checkpoint_id=folder)
        dcp.load(state, checkpoint_id=folder)
        torch.save(state["t"].to_local(), f"{folder}/t.pt")
        torch.load(f"{folder}/t.pt")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


NAMES = ("save_checkpoint", "load_checkpoint")
LIMIT = 40.0  # three worlds of ranks, started one after another
SAME = Scenario(before=2, after=2, every=2, kill=5, steps=8, noise=0.5, seed=31).check()
FEWER = Scenario(before=2, after=1, every=2, kill=5, steps=8, seed=32).check()
# The hidden two kill a rank inside a save: the checkpoint being written is not whole, the one before it is.
MORE = Scenario(before=2, after=4, every=3, kill=6, steps=9, seed=34, strike="in save").check()
THREE = Scenario(before=3, after=3, every=2, kill=4, steps=6, noise=0.5, seed=35, strike="before save").check()


def _check(name, points, props, spec, hint, hidden=False):
    return Check(name, points, 1, partial(resume_case, props=props, spec=spec), hidden=hidden, hint=hint,
                 limit=LIMIT)


CHECKS = (
    _check("W=2 -> 2: rank 1 killed before step 5, resumed from the step-4 checkpoint: the same weights at the end, "
           "exactly", 3, ("weights", "end"), SAME, HINT_RESUME),
    _check("W=2 -> 2: every rank's momentum shard comes back", 2, ("momentum",), SAME, HINT_MOMENTUM),
    _check("W=2 -> 2: every rank's random generator comes back (input noise)", 2, ("rng",), SAME, HINT_RNG),
    _check("W=2 -> 2: the data goes on where it stopped (the sampler's epoch and batch)", 2, ("sampler",), SAME,
           HINT_SAMPLER),
    _check("W=2 -> 1: resumed on one rank, same global batch: the same weights at the end, within 1e-5", 3,
           ("weights", "end"), FEWER, HINT_RESHARD),
    Check("W=2: every rank writes its own shard, none the whole optimizer state", 2, 1,
          partial(writes_case, spec=Scenario(before=2, after=2, every=2, kill=5, steps=8, seed=33).check()), hint=HINT_WRITES, limit=LIMIT),
    _check("killed in the middle of its save, resumed from the checkpoint before on a larger world", 2,
           ("weights", "end"), MORE, HINT_WHOLE, hidden=True),
    _check("three ranks (padded shards), one killed just before its save while its peers save, every piece",
           2, ("weights", "momentum", "sampler", "rng", "end"), THREE, HINT_WHOLE, hidden=True),
)

# The course's own checkpoint (its DCP state, its save and load, its resumable loop): read it, do not call it.
COURSE_CHECKPOINT = ("dpteach.training.checkpoint", "dpteach.training.resumable")

EXERCISE = Exercise(
    id="10", stem="10_checkpoint", title="Checkpoint and resume: a ZeRO-1 run that survives a kill",
    names=NAMES, stub=STUB, checks=CHECKS, warmup=_warmup,
    forbidden=tuple(f"dpteach.training.checkpoint.{name}" for name in (
        "save_checkpoint", "load_checkpoint", "training_state", "_sharded_state", "_flat_dtensor")),
    forbidden_modules=COURSE_CHECKPOINT,
    rule="this exercise asks you to write the checkpoint yourself, and your code calls the course's own "
         "(dpteach/training/checkpoint.py, which you may read)")
