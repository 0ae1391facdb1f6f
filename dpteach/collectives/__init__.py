"""Collectives written with point-to-point messages only, to be read next to notebook 02.

* ``naive.py`` - gather to a root, reduce, broadcast back (the parameter-server pattern);
* ``ring.py``  - reduce-scatter then all-gather around a ring (bandwidth-optimal);
* ``tree.py``  - binomial-tree reduce then broadcast (latency-optimal for small messages).

Every function takes ``op`` ("sum" or "avg"), works for any length and the common dtypes, on CPU
or CUDA tensors, and can record a ``trace``: a list that receives one dict per transfer
(algorithm, phase, step, src, dst, chunk, start, stop, elements) - what the notebook replays.

Its modules, one line each (``scripts/package_faces.py`` writes this list from their docstrings):

* ``_p2p``: The plumbing every hand-written collective shares: one exchange, chunking, checks, staging.
* ``naive``: Naive all-reduce: everyone sends to one root, the root adds, the root sends the sum back.
* ``ring``: Ring all-reduce, built from nothing but send and receive.
* ``tree``: Tree all-reduce: a binomial tree reduces to rank 0, then the same tree broadcasts back.
"""
from ._p2p import DTYPES, OPS, chunk_bounds, exchange
from .naive import naive_all_reduce
from .ring import ring_all_gather, ring_all_reduce, ring_reduce_scatter, ring_schedule
from .tree import tree_all_reduce

ALL_REDUCE = {"ring": ring_all_reduce, "tree": tree_all_reduce, "naive": naive_all_reduce}

__all__ = ["ring_all_reduce", "ring_reduce_scatter", "ring_all_gather", "ring_schedule", "tree_all_reduce",
           "naive_all_reduce", "chunk_bounds", "exchange", "ALL_REDUCE", "OPS", "DTYPES"]
