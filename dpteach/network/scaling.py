"""A scaling simulator: how efficient would data-parallel training be on W = 1 ... 4096 ranks?

We cannot run 4096 GPUs in a notebook, but the alpha-beta model (``dpteach.network.costmodel``) lets us
extrapolate from three numbers we *can* measure: the compute time of one step on one rank, the
latency alpha and the time per byte beta of the link. The model of one synchronous step is::

    comm(W)    = sum over buckets of T_alg(bucket bytes, W)      # ring, tree, or the faster of both
    exposed(W) = max(0, comm(W) - overlap x compute)             # what backward could not hide
    step(W)    = compute + exposed(W)
    efficiency = throughput(W) / (W x throughput(1)) = compute / step(W)

Assumptions, all of which a real cluster breaks a little:

* weak scaling: each rank keeps its per-rank batch, so compute per step does not change with W
  (the global batch grows with W; Goyal et al. 2017 show how the learning rate must follow);
* one flat network: every message pays the same alpha and beta, whatever its route; no contention.
  A real cluster has fast NVLink inside a node and InfiniBand between nodes. NCCL builds several
  rings (channels) at once and spreads them over all of a node's NICs, one per GPU on a DGX-class
  node ("rails", ``NCCL_CROSS_NIC``; NCCL ``src/graph/topo.cc``), so the inter-node part of a ring
  runs at the node's *aggregate* NIC bandwidth, 8 x 50 GB/s = 400 GB/s, not at one port's 50 GB/s.
  The ``ib_8nics`` link (``dpteach.network.PRESETS``) models that; ``ib`` shows the same nodes with one NIC;
* ``overlap`` is the fraction of the compute time that communication can hide behind. Only
  backward can hide it (gradients do not exist before), and backward is about two thirds of a
  step's arithmetic (twice the forward's), so 0.6 assumes that nearly all of backward hides
  communication; 0 is no overlap. Lesson 09 measures the fraction its own run achieved;
* identical ranks: no stragglers, and the input pipeline keeps up;
* the textbook tree (binomial, whole message per step). NCCL's pipelined double binary tree
  moves large messages far better; ``auto`` here still shows *why* a library switches algorithm
  as W grows: the ring's 2(W-1) latencies grow linearly, the tree's only with log2 W.

Published figures for the links (``dpteach.network.PRESETS``; per direction, order of magnitude; measure your own with
``dpteach bench`` or nccl-tests, whose PERFORMANCE.md explains bus bandwidth):

* NVLink 4 (H100 SXM): 900 GB/s bidirectional per GPU, i.e. ~450 GB/s each way (NVIDIA's NVLink
  page and Hopper architecture paper); latency a few microseconds per step;
* InfiniBand NDR: 400 Gb/s = 50 GB/s per port; a DGX H100 has eight single-port 400 Gb/s
  ConnectX-7 NICs for its compute fabric, one per GPU (NVIDIA DGX BasePOD reference architecture),
  400 GB/s per node; a few microseconds per message.
"""
from __future__ import annotations

import math

from .. import validate

from . import costmodel
from .link import Link

ALGORITHMS = ("ring", "tree", "auto")


def allreduce_time(nbytes: float, world_size: int, link: Link, algorithm: str = "ring") -> tuple[float, str]:
    """Predicted time of one all-reduce and the algorithm used (``auto`` picks the faster one)."""
    validate.choice("algorithm", algorithm, ALGORITHMS)
    n = float(round(nbytes))
    if algorithm == "auto":
        choice = costmodel.choose_algorithm(n, world_size, link, candidates=("ring", "tree"))
        return choice.times[choice.algorithm], choice.algorithm
    return costmodel.predict(algorithm, n, world_size, link), algorithm


def predict_step(world_size: int, compute_s: float, grad_bytes: float, link: Link, overlap: float = 0.0,
                 algorithm: str = "ring", bucket_bytes: float | None = None) -> dict:
    """One step at ``world_size`` ranks: compute, communication, exposed part, efficiency."""
    validate.integer("world_size", world_size, low=1)
    compute_s = validate.number("compute_s", compute_s, above=0)
    grad_bytes = validate.number("grad_bytes", grad_bytes, low=0)
    overlap = validate.number("overlap", overlap, low=0, high=1)
    if bucket_bytes is None or bucket_bytes >= grad_bytes:
        buckets = [grad_bytes] if grad_bytes else []
    else:
        bucket_bytes = validate.number("bucket_bytes", bucket_bytes, above=0)
        full, rest = divmod(grad_bytes, bucket_bytes)
        buckets = [bucket_bytes] * int(full) + ([rest] if rest else [])
    comm, used = 0.0, set()
    for size in buckets:
        seconds, name = allreduce_time(size, world_size, link, algorithm)
        comm += seconds
        used.add(name)
    exposed = max(0.0, comm - overlap * compute_s)
    step = compute_s + exposed
    return {"world_size": world_size, "compute_s": compute_s, "comm_s": comm, "exposed_s": exposed,
            "step_s": step, "efficiency": compute_s / step, "speedup": world_size * compute_s / step,
            "messages": len(buckets), "algorithms": sorted(used)}


def simulate(world_sizes, compute_s: float, grad_bytes: float, link: Link, overlap: float = 0.0,
             algorithm: str = "ring", bucket_bytes: float | None = None) -> list[dict]:
    """:func:`predict_step` for every W in ``world_sizes`` (a list of dicts, one per W)."""
    return [predict_step(int(w), compute_s, grad_bytes, link, overlap, algorithm, bucket_bytes)
            for w in world_sizes]


def powers_of_two(largest: int = 4096) -> list[int]:
    """1, 2, 4, ... up to ``largest``: the usual x axis of a scaling plot."""
    return [1 << k for k in range(int(math.log2(largest)) + 1)]
