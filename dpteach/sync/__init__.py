"""Gradient-sync strategies, one small file each, to be read next to the notebooks.

===================  ===========================================================  ======================
name                 what it does                                                 equals single process?
===================  ===========================================================  ======================
``local``            no communication (the compute floor)                         no - not data parallel
``naive``            one blocking all-reduce per parameter, after backward        yes, up to rounding
``bucketed``         one all-reduce per bucket, after backward                    yes, up to rounding
``overlap``          bucket all-reduces launched from autograd hooks in backward  yes, up to rounding
``ddp``              torch's DistributedDataParallel, the reference               yes, up to rounding
``deterministic``    after backward, every element summed in rank order           yes, bit for bit (*)
``int8``             8-bit quantised gradients (``int8_ef``: error feedback)      no - measured drift
``fp16``             gradients cast to fp16 (``bf16``: bfloat16)                  no - measured drift
``async``            parameter server, no barrier, stale gradients                no - measured drift
``powersgd``         rank-r sketch P Q^T of each gradient matrix; error feedback  no - measured drift
``powersgd_torch``   DDP with torch's own powerSGD_hook, powersgd's reference     no - measured drift
``local_sgd``        each rank steps alone; weights averaged every H steps        no (yes at H=1 with SGD)
``diloco``           local SGD with an outer Nesterov step on the averaged change no - measured drift
``streaming_diloco`` diloco by fragments in turn, overlapped, 4-bit outer gradients no - measured drift
``demo``             DeMo: own momentum per rank, top-k of its DCT all-gathered    no - measured drift
``muon``             Muon, each matrix whole on one rank (optimizer="muon")      yes, up to rounding
``zero1``            each rank keeps the optimizer state of its shard only       yes, up to rounding
``zero2``            gradients reduce-scattered in backward: shards of them too  yes, up to rounding
``zero3``            parameters sharded too, all-gathered layer by layer         yes, up to rounding
``fsdp``             torch's FSDP2 (``fully_shard`` per layer), zero3's reference yes, up to rounding
``hsdp``             zero3 inside a node, gradient shards all-reduced across     yes, up to rounding
``hsdp_torch``       torch's FSDP2 on a (replicate, shard) mesh, the reference   yes, up to rounding
``zeropp``           ZeRO++: zero3 + int8 weights, node-local copy, int4 grads    no (hpZ alone: yes)
===================  ===========================================================  ======================

"Up to rounding": an all-reduce adds the W gradients in an order of its own choosing, and float32
addition is not associative, so the weights differ from one process's by ~1e-7
(``reference.exact_tolerance`` states the tolerance). (*) ``deterministic`` fixes the order, and
equals the reference that adds shard gradients in the same order
(``reference.train_single_process(..., fixed_order=True)``) exactly.

Every strategy says what it is through the attributes of ``base.Strategy`` (exact? in lockstep?
how many ranks only serve?), so the trainer and the experiments never test for a name; a strategy's own
options are declared in its file (``knobs.Knob``). A new strategy is its file plus one line in ``STRATEGIES``.

Its modules, one line each (``scripts/package_faces.py`` writes this list from their docstrings):

* ``async_ps``: ``async``: a parameter server that applies each worker's gradient the moment it arrives.
* ``base``: What every gradient-sync strategy answers: when, and how, do the ranks' gradients become their average?
* ``blockwise``: Block-wise quantisation: a float tensor as small integers, one float32 scale per block of ``block``
  values.
* ``bucketed``: ``bucketed``: after backward, gradients are packed into buckets and each bucket is all-reduced once.
* ``compressed``: ``compressed``: send fewer bits per gradient - 8-bit integers, or 16-bit floats.
* ``ddp``: ``ddp``: PyTorch's own ``DistributedDataParallel``, the reference the hand-written strategies match.
* ``demo``: ``demo``: decoupled momentum - each rank keeps its own momentum and sends only its fast-moving part.
* ``deterministic``: ``deterministic``: every gradient element is summed over the ranks in one fixed order, 0, 1,
  ..., W-1.
* ``diloco``: ``diloco``: local SGD with an optimizer on the outside - DiLoCo (Douillard et al., "DiLoCo:
  Distributed Low-Communication Training of Language Models", 2023).
* ``fsdp``: ``fsdp``: torch's FSDP2, ``fully_shard`` on every layer - the reference for ``zero3``, as ``ddp`` is for
  ``overlap``.
* ``fsdp_trace``: FSDP2's collectives of one step, read from the ranges it records for the profiler.
* ``hsdp``: ``hsdp``: hybrid sharding - ZeRO-3 inside each node, plain replication across nodes.
* ``knobs``: A strategy's own options ("knobs"), declared in the strategy's file: name, type, default, what is
  allowed, help.
* ``local``: ``local``: no communication at all - the compute floor every other strategy is measured against.
* ``local_sgd``: ``local_sgd``: every rank steps on its own gradients, and the ranks average their *weights* every H
  steps.
* ``muon``: ``muon``: Muon on data-parallel ranks - each weight matrix owned whole by one rank, ZeRO-1 style.
* ``naive``: ``naive``: after backward, one blocking all-reduce per parameter.
* ``overlap``: ``overlap``: each bucket's all-reduce starts while backward is still computing earlier layers.
* ``powersgd``: ``powersgd``: send a rank-r sketch of each gradient matrix instead of the matrix (lesson 14).
* ``powersgd_torch``: ``powersgd_torch``: DDP with torch's own ``powerSGD_hook`` - the reference ``powersgd.py`` is
  held to.
* ``sharding``: What the ZeRO stages share: flat shards, and the two halves of an all-reduce.
* ``streaming_diloco``: ``streaming_diloco``: DiLoCo's outer step one fragment of the model at a time, overlapped,
  in 4 bits.
* ``zero1``: ``zero1``: ZeRO stage 1 - each rank keeps the optimizer state of its own shard only.
* ``zero2``: ``zero2``: ZeRO stage 2 - gradients are sharded too, reduce-scattered during backward.
* ``zero3``: ``zero3``: ZeRO stage 3 - parameters sharded too, gathered layer by layer just before they are used.
* ``zeropp``: ``zeropp``: ZeRO++ - ZeRO-3 with three ways to send less across nodes, each switched on its own.
"""
from .async_ps import ParameterServer
from .base import Strategy
from .bucketed import BucketedSync
from .compressed import Bf16Sync, Fp16Sync, Int8ErrorFeedbackSync, Int8Sync
from .ddp import TorchDDP
from .deterministic import DeterministicSync
from .demo import DeMo
from .diloco import DiLoCo
from .streaming_diloco import StreamingDiLoCo
from .fsdp import TorchFSDP
from .hsdp import HybridZero3, TorchHSDP
from .knobs import Knob
from .local import LocalOnly
from .local_sgd import LocalSGD
from .muon import DistributedMuon
from .naive import NaiveSync
from .overlap import OverlapSync
from .powersgd import PowerSGD
from .powersgd_torch import TorchPowerSGD
from .zero1 import Zero1
from .zero2 import Zero2
from .zero3 import Zero3
from .zeropp import ZeroPlusPlus

# name -> the class that is that strategy (its attributes say what it is: ``base.Strategy``)
STRATEGIES = {cls.name: cls for cls in (
    LocalOnly, NaiveSync, BucketedSync, OverlapSync, TorchDDP, DeterministicSync,
    Int8Sync, Int8ErrorFeedbackSync, Fp16Sync, Bf16Sync, PowerSGD, TorchPowerSGD,
    Zero1, Zero2, Zero3, TorchFSDP, HybridZero3, TorchHSDP, ZeroPlusPlus,
    LocalSGD, DiLoCo, StreamingDiLoCo, DeMo, DistributedMuon,
    ParameterServer,  # not in lockstep: its own loop (async_ps.py)
)}
EXACT = tuple(name for name, cls in STRATEGIES.items() if cls.exact)
# ZeRO's stages, FSDP2 and the hybrid ones: the exact sharded strategies (zeropp and muon shard too, and round)
SHARDED = tuple(name for name, cls in STRATEGIES.items() if cls.shards and cls.exact)
REPLICATED = tuple(name for name in EXACT if name not in SHARDED)  # every rank holds everything


def strategy_class(name: str) -> type[Strategy]:
    """The class behind strategy ``name``: what it says about itself (``Strategy``'s attributes)."""
    return STRATEGIES[name]


def all_knobs() -> dict[str, tuple[Knob, list[str]]]:
    """Every strategy's knobs by name: ``name -> (its declaration, the strategies that take it)``; where two
    strategies share a name (diloco's ``sync_every`` is local_sgd's), the first declaration stands for both."""
    knobs = {}
    for name, cls in STRATEGIES.items():
        for knob in cls.knobs:
            knobs.setdefault(knob.name, (knob, []))[1].append(name)
    return knobs


def make_strategy(name: str, model, timeline, bucket_mb: float = 1.0, first_bucket_mb=None, link=None,
                  all_reduce: str = "builtin", grad_comm: str = "fp32", group=None, knobs: dict | None = None,
                  timed_world_size: int | None = None):
    """Lockstep strategy ``name`` for this rank's ``model``; ``link`` (a ``dpteach.network.Link``) emulates a
    network; ``all_reduce`` ("builtin", "ring", "tree") is the all-reduce it runs, where it takes one;
    ``grad_comm`` the dtype its gradients travel in, where it takes one (``ddp``: a communication hook);
    ``group`` the ranks it synchronises among (a ``ProcessGroup`` or a 1-D ``DeviceMesh``; None: every rank);
    ``knobs`` the strategy's own options (``Strategy.knobs``), the ones not given at their defaults;
    ``timed_world_size``: with emulated peers, the world this one real rank times its messages for."""
    cls = STRATEGIES[name]
    options = cls.settings(knobs)
    if all_reduce != "builtin":
        options = {**options, "all_reduce": all_reduce}
    if grad_comm != "fp32":
        options = {**options, "grad_comm": grad_comm}
    if timed_world_size is not None:
        options = {**options, "timed_world_size": timed_world_size}
    return cls(model, timeline, bucket_mb=bucket_mb, first_bucket_mb=first_bucket_mb, link=link, group=group,
               **options)
