"""Tree all-reduce: a binomial tree reduces to rank 0, then the same tree broadcasts back.

With W=6 ranks, the reduce phase pairs ranks at distance 1, 2, 4 (rank r sends to r - d when
bit d is the lowest bit set in r)::

    distance 1   1 -> 0    3 -> 2    5 -> 4
    distance 2   2 -> 0              (4 has no partner at 6: it waits)
    distance 4   4 -> 0

and the broadcast walks the same edges backwards (distance 4, 2, 1). That is 2 x ceil(log2 W)
steps instead of the ring's 2(W-1): far fewer latencies, which wins for small messages. But each
step moves the whole message, so for large messages the ring wins - NCCL's tuner makes this very
trade by message size (its tree is a pipelined double binary tree; the idea is the same).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ._p2p import check_arguments, exchange, finish_average, flat_work_buffer, gather_shapes, record


def tree_all_reduce(tensor: torch.Tensor, op: str = "sum", trace: list | None = None, group=None,
                    check: bool = True) -> torch.Tensor:
    """Sum (or average) ``tensor`` across all ranks, in place, along a binomial tree rooted at 0."""
    check_arguments("tree_all_reduce", tensor, op)
    if check:
        gather_shapes("tree_all_reduce", tensor, group)
    world, me = dist.get_world_size(group), dist.get_rank(group)
    with flat_work_buffer(tensor, group) as buf:
        n = buf.numel()
        inbox = torch.empty_like(buf)
        distances = []
        distance, step = 1, 0
        # Reduce: receive from children (me + d) until the lowest set bit of my rank, then send up.
        while distance < world:
            if me & distance:
                record(trace, algorithm="tree", phase="reduce", step=step, src=me, dst=me - distance,
                       chunk=None, start=0, stop=n)
                exchange(buf, me - distance, None, None, group)
                break
            if me + distance < world:
                exchange(None, None, inbox, me + distance, group)
                buf += inbox
            distances.append(distance)
            distance, step = distance * 2, step + 1
        if me == 0 and op == "avg":
            finish_average(buf, world)
        # Broadcast: receive from the parent I sent to, then pass down to the children I heard from.
        if me != 0:
            exchange(None, None, buf, me - distance, group)
        levels = (world - 1).bit_length()  # ceil(log2 W): the number of tree levels
        for child_distance in reversed(distances):
            if me + child_distance < world:
                level_from_top = levels - child_distance.bit_length()
                record(trace, algorithm="tree", phase="broadcast", step=level_from_top, src=me,
                       dst=me + child_distance, chunk=None, start=0, stop=n)
                exchange(buf, me + child_distance, None, None, group)
    return tensor
