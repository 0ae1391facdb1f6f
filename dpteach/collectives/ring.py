"""Ring all-reduce, built from nothing but send and receive.

Walk through it first on a small example: 3 ranks, each holding 6 numbers, split in 3 chunks
(chunk c is elements [2c, 2c+2)). Write rank r's copy of chunk c as ``c^r``; the goal is that every
rank ends with every chunk summed over all ranks, ``c^0 + c^1 + c^2``, written ``c*``.

The ranks stand in a ring: rank r always sends to r+1 and receives from r-1 (mod 3).

Phase 1, reduce-scatter (W-1 = 2 steps). At step s, rank r sends chunk (r-s-1) mod W, and adds
what arrives into chunk (r-s-2) mod W::

    step 0   rank 0 sends 2^0 -> rank 1     rank 1 adds it: chunk 2 = 2^0+2^1
             rank 1 sends 0^1 -> rank 2     rank 2 adds it: chunk 0 = 0^1+0^2
             rank 2 sends 1^2 -> rank 0     rank 0 adds it: chunk 1 = 1^2+1^0
    step 1   rank 0 sends its chunk 1 (1^2+1^0) -> rank 1, which now holds 1*
             rank 1 sends its chunk 2 (2^0+2^1) -> rank 2, which now holds 2*
             rank 2 sends its chunk 0 (0^1+0^2) -> rank 0, which now holds 0*

Every chunk travelled W-1 hops collecting one contribution per hop, so rank r owns the finished
chunk r: exactly what ``dist.reduce_scatter_tensor`` produces.

Phase 2, all-gather (W-1 = 2 steps). At step s, rank r sends chunk (r-s) mod W and stores what
arrives as chunk (r-s-1) mod W::

    step 0   rank 0 sends 0* -> 1,   rank 1 sends 1* -> 2,   rank 2 sends 2* -> 0
    step 1   rank 0 sends 2* -> 1,   rank 1 sends 0* -> 2,   rank 2 sends 1* -> 0

Now every rank holds 0*, 1*, 2*. Cost: each rank sent 2(W-1) messages of n/W elements, i.e.
2(W-1)/W x n in total - almost 2n however large W grows. No all-reduce built from point-to-point
transfers can send less per rank, so the ring is bandwidth-optimal (Patarasuk & Yuan, 2009); the
same factor is why nccl-tests reports "bus bandwidth" = algbw x 2(W-1)/W, whatever the algorithm
(its doc/PERFORMANCE.md). The ring's weakness is latency: 2(W-1) sequential steps, which is why, in
the alpha-beta model, small messages prefer a tree (see ``tree.py`` and ``dpteach.network.costmodel``).

``pieces`` splits each step's chunk further so that adding piece i overlaps with receiving piece
i+1 - the same pipelining NCCL does with its slices.

``ring_schedule`` below states the two step formulas once; every loop here, plain or pipelined,
takes its chunk numbers from it and records in ``trace`` the very slice it has just sent.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ._p2p import (check_arguments, chunk_bounds, exchange, finish_average, flat_work_buffer, gather_shapes, post,
                   record, stages_through_host)


def ring_schedule(me: int, world: int, phase: str):
    """Yield ``(step, send_chunk, recv_chunk)`` for rank ``me`` in one phase: the ring's step formula.

    Rank r receives what its left neighbour sends at the same step: the chunk one below its own.
    Rank 0 of the 3-rank example above::

        >>> list(ring_schedule(0, 3, "reduce_scatter"))  # sends 2 then 1, adds into 1 then 0
        [(0, 2, 1), (1, 1, 0)]
        >>> list(ring_schedule(0, 3, "all_gather"))  # sends 0* then 2*, stores 2* then 1*
        [(0, 0, 2), (1, 2, 1)]
    """
    if phase not in ("reduce_scatter", "all_gather"):
        raise ValueError(f"phase={phase!r} is not allowed: use 'reduce_scatter' or 'all_gather'")
    # Reduce-scatter starts one chunk behind rank r's own, so that the last chunk r receives (and
    # finishes) is chunk r; all-gather starts with that finished chunk. Each later step forwards the
    # chunk that arrived in the step before.
    lag = 1 if phase == "reduce_scatter" else 0
    for step in range(world - 1):
        send_chunk = (me - step - lag) % world
        yield step, send_chunk, (send_chunk - 1) % world


def ring_all_reduce(tensor: torch.Tensor, op: str = "sum", trace: list | None = None, group=None,
                    check: bool = True, pieces: int = 1) -> torch.Tensor:
    """Sum (or average) ``tensor`` across all ranks, in place: reduce-scatter, then all-gather."""
    check_arguments("ring_all_reduce", tensor, op)
    if check:
        gather_shapes("ring_all_reduce", tensor, group)
    world, me = dist.get_world_size(group), dist.get_rank(group)
    with flat_work_buffer(tensor, group) as buf:
        bounds = chunk_bounds(buf.numel(), world)
        _reduce_scatter(buf, bounds, me, world, group, trace, pieces)
        if op == "avg":
            start, stop = bounds[me]
            finish_average(buf[start:stop], world)
        _all_gather(buf, bounds, me, world, group, trace, pieces)
    return tensor


def ring_reduce_scatter(tensor: torch.Tensor, op: str = "sum", trace: list | None = None, group=None,
                        check: bool = True, pieces: int = 1) -> torch.Tensor:
    """Return this rank's chunk of the reduced tensor (chunk r of ``chunk_bounds(n, W)`` on rank r).

    The input is left untouched; the result lives on the input's device.
    """
    check_arguments("ring_reduce_scatter", tensor, op)
    if check:
        gather_shapes("ring_reduce_scatter", tensor, group)
    world, me = dist.get_world_size(group), dist.get_rank(group)
    host = "cpu" if stages_through_host(tensor, group) else tensor.device
    buf = tensor.detach().reshape(-1).to(host, copy=True)
    bounds = chunk_bounds(buf.numel(), world)
    _reduce_scatter(buf, bounds, me, world, group, trace, pieces)
    start, stop = bounds[me]
    mine = buf[start:stop]
    if op == "avg":
        finish_average(mine, world)
    return mine.clone().to(tensor.device)


def ring_all_gather(chunk: torch.Tensor, trace: list | None = None, group=None) -> torch.Tensor:
    """Concatenate every rank's ``chunk`` in rank order; chunks may differ in length.

    The ranks first tell each other their lengths (a chunk of a reduce-scatter of n elements is
    n//W or n//W + 1 long), then pass the chunks round the ring.
    """
    check_arguments("ring_all_gather", chunk)
    sizes = gather_shapes("ring_all_gather", chunk, group, must_match=False)
    world, me = dist.get_world_size(group), dist.get_rank(group)
    host = "cpu" if stages_through_host(chunk, group) else chunk.device
    offsets = [sum(sizes[:r]) for r in range(world + 1)]
    bounds = [(offsets[r], offsets[r + 1]) for r in range(world)]
    out = torch.empty(offsets[-1], dtype=chunk.dtype, device=host)
    out[bounds[me][0]:bounds[me][1]] = chunk.detach().reshape(-1).to(host)
    _all_gather(out, bounds, me, world, group, trace)
    return out.to(chunk.device)


def _reduce_scatter(buf, bounds, me, world, group, trace, pieces) -> None:
    if pieces > 1:
        return _reduce_scatter_pipelined(buf, bounds, me, world, group, trace, pieces)
    right, left = (me + 1) % world, (me - 1) % world
    inbox = torch.empty(max(stop - start for start, stop in bounds), dtype=buf.dtype, device=buf.device)
    for step, send_chunk, recv_chunk in ring_schedule(me, world, "reduce_scatter"):
        (s0, s1), (r0, r1) = bounds[send_chunk], bounds[recv_chunk]
        exchange(buf[s0:s1], right, inbox[:r1 - r0], left, group)
        record(trace, algorithm="ring", phase="reduce_scatter", step=step, src=me, dst=right,
               chunk=send_chunk, start=s0, stop=s1)  # the trace notes what was just sent: buf[s0:s1]
        buf[r0:r1] += inbox[:r1 - r0]


def _all_gather(buf, bounds, me, world, group, trace, pieces=1) -> None:
    if pieces > 1:
        return _all_gather_pipelined(buf, bounds, me, world, group, trace, pieces)
    right, left = (me + 1) % world, (me - 1) % world
    for step, send_chunk, recv_chunk in ring_schedule(me, world, "all_gather"):
        (s0, s1), (r0, r1) = bounds[send_chunk], bounds[recv_chunk]
        exchange(buf[s0:s1], right, buf[r0:r1], left, group)
        record(trace, algorithm="ring", phase="all_gather", step=step, src=me, dst=right,
               chunk=send_chunk, start=s0, stop=s1)


# --- Pipelined versions ---------------------------------------------------------------------
# Same chunks, same order, but each chunk is cut into `pieces` and a piece moves on as soon as it
# is ready: piece i of step s+1 is sent the moment piece i of step s has arrived (and, in
# reduce-scatter, been added), instead of waiting for the whole of step s. NCCL does the same with
# its "slices", gloo's own ring with "segments".
#
# Each (step, piece) is one batch holding this rank's send to the right and its receive from the
# left, posted in the same order on every rank, so the k-th batch of every rank meets the k-th
# batch of its neighbours. That pairing is what NCCL needs: it runs the batches one after another
# on one stream, so a rank that first queued all its receives and only then its sends would wait
# forever for a neighbour doing the same. Only the receive is waited for before moving on; the
# sends stay in flight and overlap the next pieces.
#
# The trace keeps one record per step for the whole chunk, exactly as the plain loops write it:
# the pieces are how the chunk travels, not extra transfers.

def _reduce_scatter_pipelined(buf, bounds, me, world, group, trace, pieces) -> None:
    right, left = (me + 1) % world, (me - 1) % world
    inbox = torch.tensor_split(torch.empty(max(b - a for a, b in bounds), dtype=buf.dtype, device=buf.device),
                               pieces)
    sends = []
    for step, send_chunk, recv_chunk in ring_schedule(me, world, "reduce_scatter"):
        (s0, s1), (r0, r1) = bounds[send_chunk], bounds[recv_chunk]
        outgoing = torch.tensor_split(buf[s0:s1], pieces)  # finished by the step before
        for i, target in enumerate(torch.tensor_split(buf[r0:r1], pieces)):
            arriving = inbox[i][:target.numel()]
            receive, send = post(outgoing[i], right, arriving, left, group)
            sends.append(send)
            if receive is not None:
                receive.wait()
                target += arriving  # piece i of this chunk is done: step + 1 sends it on
        record(trace, algorithm="ring", phase="reduce_scatter", step=step, src=me, dst=right,
               chunk=send_chunk, start=s0, stop=s1)  # every piece of buf[s0:s1] is posted
    _wait_all(sends)


def _all_gather_pipelined(buf, bounds, me, world, group, trace, pieces) -> None:
    right, left = (me + 1) % world, (me - 1) % world
    sends = []
    for step, send_chunk, recv_chunk in ring_schedule(me, world, "all_gather"):
        (s0, s1), (r0, r1) = bounds[send_chunk], bounds[recv_chunk]
        outgoing = torch.tensor_split(buf[s0:s1], pieces)  # arrived in the step before
        for piece, arriving in zip(outgoing, torch.tensor_split(buf[r0:r1], pieces)):
            receive, send = post(piece, right, arriving, left, group)
            sends.append(send)
            if receive is not None:
                receive.wait()
        record(trace, algorithm="ring", phase="all_gather", step=step, src=me, dst=right,
               chunk=send_chunk, start=s0, stop=s1)
    _wait_all(sends)


def _wait_all(requests) -> None:
    for request in requests:
        if request is not None:
            request.wait()
