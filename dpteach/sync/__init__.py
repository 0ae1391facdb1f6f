"""Gradient-sync strategies, one small file each, to be read next to the notebooks.

=================  ===========================================================  ======================
name               what it does                                                 equals single process?
=================  ===========================================================  ======================
``local``          no communication (the compute floor)                         no - not data parallel
``naive``          one blocking all-reduce per parameter, after backward        yes, up to rounding
``bucketed``       one all-reduce per bucket, after backward                    yes, up to rounding
``overlap``        bucket all-reduces launched from autograd hooks in backward  yes, up to rounding
``ddp``            torch's DistributedDataParallel, the reference               yes, up to rounding
``deterministic``  after backward, every element summed in rank order           yes, bit for bit (*)
``int8``           8-bit quantised gradients (``int8_ef``: error feedback)      no - measured drift
``fp16``           gradients cast to fp16 (``bf16``: bfloat16)                  no - measured drift
``async``          parameter server, no barrier, stale gradients                no - measured drift
=================  ===========================================================  ======================

"Up to rounding": an all-reduce adds the W gradients in an order of its own choosing, and float32
addition is not associative, so the weights differ from one process's by ~1e-7 (``train.py`` states
the tolerance). (*) ``deterministic`` fixes the order, and equals the reference that adds shard
gradients in the same order (``reference.train_single_process(..., fixed_order=True)``) exactly.
"""
from .bucketed import BucketedSync
from .compressed import CompressedSync
from .ddp import TorchDDP
from .deterministic import DeterministicSync
from .local import LocalOnly
from .naive import NaiveSync
from .overlap import OverlapSync

# name -> (class, extra options)
STRATEGIES = {
    "local": (LocalOnly, {}),
    "naive": (NaiveSync, {}),
    "bucketed": (BucketedSync, {}),
    "overlap": (OverlapSync, {}),
    "ddp": (TorchDDP, {}),
    "deterministic": (DeterministicSync, {}),
    "int8": (CompressedSync, {"codec": "int8"}),
    "int8_ef": (CompressedSync, {"codec": "int8", "error_feedback": True}),
    "fp16": (CompressedSync, {"codec": "fp16"}),
    "bf16": (CompressedSync, {"codec": "bf16"}),
    "async": (None, {}),  # its own loop: see async_ps.py
}
EXACT = ("naive", "bucketed", "overlap", "ddp", "deterministic")


def make_strategy(name: str, model, timeline, bucket_mb: float = 1.0, first_bucket_mb=None, link=None):
    """Strategy ``name`` for this rank's ``model``; ``link`` (a ``dpteach.link.Link``) emulates a network."""
    cls, options = STRATEGIES[name]
    return cls(model, timeline, bucket_mb=bucket_mb, first_bucket_mb=first_bucket_mb, link=link, **options)
