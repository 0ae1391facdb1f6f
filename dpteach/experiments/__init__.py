"""One function per lesson: each runs real ranks and returns plain data (dicts and lists).

Notebooks, widgets, the command line and the tests all call these, so a number printed in a
notebook and a number asserted in a test come from the same code.

Which function lives in which module is written once, in the course table (``dpteach.course``);
``from dpteach.experiments import overlap_timeline`` imports ``overlap.py`` on first use, so a lesson
loads its own experiments and not the whole course's.

Its modules, one line each (``scripts/package_faces.py`` writes this list from their docstrings):

* ``accumulation``: ``accumulation_sweep``: what gradient accumulation buys, what it costs, and two ways to get it
  wrong.
* ``activations``: How big a batch (lesson 15): activation memory per sample, and what activation checkpointing
  trades for it.
* ``asynchronous``: ``async_staleness``: a parameter server that never waits, and what it costs.
* ``batch_runs``: The runs of lessons 15 and 09 that train the MLP on W ranks to a target loss at a given global
  batch: one run (:func:`train_run`), several side by side in one world (:func:`runs_on_rank`), the search for each
  batch's best learning rate (:func:`search_on_rank`) and the critical-batch result from it
  (:func:`critical_result`).
* ``batch_size``: Lesson 15: how big a batch - the learning-rate rules and the critical batch size, measured on real
  ranks.
* ``bench``: All-reduce benchmark: time per size and algorithm, with nccl-tests' algbw and busbw.
* ``bucketing``: Lesson 03: one all-reduce per parameter, or one per bucket?
* ``checkpoints``: Checkpoints (lesson 13, second half): resuming exactly, what a checkpoint costs, and how often to
  take one.
* ``collectives``: Lesson 02: the collectives, the ring step by step, and the alpha-beta model against the clock.
* ``compare``: Every strategy on the same model and data, measured in one run and held to one reference.
* ``compression``: ``compression_tradeoff``: fewer bytes on the wire, bought with a drift away from single-process
  training.
* ``data_sharding``: Lesson 08: two ways the data can break a data-parallel job, run on real ranks.
* ``ddp_buckets``: Lesson 03: the buckets torch's DDP really builds, iteration by iteration, beside the course's
  rule.
* ``ddp_options``: Lesson 03: two DDP options a learner meets in real code, each measured on real ranks.
* ``debugging``: Lesson 02: a collective that the ranks do not agree on, with and without torch's checks.
* ``determinism``: Lesson 01, part two: close to single-process training, or identical to it?
* ``diagnosis``: Lesson 17: profile a DDP job with a planted problem, and let the trace name it.
* ``equivalence``: Lesson 01: the average of the replicas' gradients *is* the large-batch gradient.
* ``failures``: When ranks fail (lesson 13, first half): what the peers of a failed rank see, and a job that
  torchrun restarts.
* ``frontier``: Lesson 16: the frontier of sending less - ZeRO++, DeMo, streaming DiLoCo and a distributed Muon
  step.
* ``hybrid``: Hybrid sharding on a network of two levels (lesson 14, sending less): what crosses the slow link.
* ``input_pipeline``: ``input_pipeline``: a slow loader starves the ranks; prefetching and worker processes feed
  them again.
* ``machine``: Lesson 00: what this machine is, and how fast its ranks can talk to each other.
* ``memory``: Lesson 01 (second half): what one replica must hold, and what sharding it with ZeRO changes.
* ``mixed_precision``: Mixed precision with data parallelism (lesson 12), measured on real ranks.
* ``on_this_machine``: What each lesson will show on this machine: the table ``dpteach doctor`` prints under the
  GPUs.
* ``overlap``: ``overlap_timeline``: where a data-parallel step spends its time, and which fix removes the idle
  part.
* ``powersgd``: ``powersgd_against_torch``: the course's PowerSGD and torch's own hook, fed the same gradients, on
  real ranks.
* ``powersgd_pairs``: The course's PowerSGD and torch's own hook, fed the same gradients on one rank
  (:func:`on_rank`); lesson 14's ``powersgd_against_torch`` runs it in a world of its own, ``sending_less`` inside
  the world its methods train in.
* ``scaling``: Lesson 09: does W times the ranks give W times the throughput?
* ``scaling_rows``: Lesson 09's table, read off the ranks: what one world's passes become as a row.
* ``sending_less``: Lesson 14: methods that send less, judged by the time they take to reach a target loss on a
  given link.
* ``sharding``: Sharded data parallelism (lesson 11): what ZeRO's stages and FSDP2 save, measured on real ranks.
* ``step_parts``: The parts of a training step that lesson 14 measures apart: each method's compute, and each
  message on each link.
* ``torchft_groups``: Surviving a failure without a restart (lesson 13, last section): torchft's replica groups.
"""
from importlib import import_module

from ..course import experiment_homes

_HOMES = experiment_homes()
__all__ = list(_HOMES)


def __getattr__(name: str):
    module = _HOMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value  # the next look-up is an ordinary one
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
