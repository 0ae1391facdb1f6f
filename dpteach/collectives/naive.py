"""Naive all-reduce: everyone sends to one root, the root adds, the root sends the sum back.

This is the parameter-server pattern. With W=4 ranks and n elements each::

    gather      rank 1 -> 0, rank 2 -> 0, rank 3 -> 0      (root receives 3n elements)
    reduce      root adds the four copies
    broadcast   rank 0 -> 1, rank 0 -> 2, rank 0 -> 3      (root sends 3n elements)

Correct, and easy to read - but the root's link carries 2(W-1)n elements while the others sit
idle, so the time grows linearly with W. The ring moves the same result with every link busy and
only 2(W-1)/W x n elements per rank (``ring.py``).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ._p2p import check_arguments, exchange, finish_average, flat_work_buffer, gather_shapes, record


def naive_all_reduce(tensor: torch.Tensor, op: str = "sum", trace: list | None = None, group=None,
                     check: bool = True, root: int = 0) -> torch.Tensor:
    """Sum (or average) ``tensor`` across all ranks, in place, through the root rank."""
    check_arguments("naive_all_reduce", tensor, op)
    world, me = dist.get_world_size(group), dist.get_rank(group)
    if not isinstance(root, int) or not 0 <= root < world:
        raise ValueError(f"naive_all_reduce: root={root!r} is not allowed: use a rank in 0..{world - 1}")
    if check:
        gather_shapes("naive_all_reduce", tensor, group)
    with flat_work_buffer(tensor, group) as buf:
        n = buf.numel()
        if me == root:
            inbox = torch.empty_like(buf)
            for step, src in enumerate(r for r in range(world) if r != root):
                record(trace, algorithm="naive", phase="gather", step=step, src=src, dst=root,
                       chunk=None, start=0, stop=n)
                exchange(None, None, inbox, src, group)
                buf += inbox
            if op == "avg":
                finish_average(buf, world)
            for step, dst in enumerate(r for r in range(world) if r != root):
                record(trace, algorithm="naive", phase="broadcast", step=step, src=root, dst=dst,
                       chunk=None, start=0, stop=n)
                exchange(buf, dst, None, None, group)
        else:
            exchange(buf, root, None, None, group)
            exchange(None, None, buf, root, group)
    return tensor
