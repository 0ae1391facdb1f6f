"""Exercise 02: a complete ring all-reduce, in place, for any shape and dtype.

The learner puts exercise 01's two passes together: ``ring_all_reduce(tensor)`` replaces ``tensor`` by
its sum over ranks. What is checked beyond 01: in place (the caller's tensor changes - that is how
gradients are synchronised), shapes other than 1-D, a tensor that is a non-contiguous view, calling it
twice in a row, and 2(W-1)/W of the tensor on the wire per rank - the bandwidth-optimal ring, not a
gather to one rank and a broadcast back.
"""
from __future__ import annotations

from functools import partial

import torch

from ...collectives import chunk_bounds
from ..spec import Check, Exercise, Fail, no_collectives
from .common import check_ring_traffic, everyones, rank_data, secret_seed, sum_over_ranks

STUB = '''\
import torch
import torch.distributed as dist
from dpteach.collectives import chunk_bounds, exchange


def ring_all_reduce(tensor):
    """Replace `tensor` on every rank by its sum over all ranks - in place, around a ring - and return it.

    `tensor` can have any shape (it may even be a non-contiguous view) and any of the usual dtypes;
    every rank passes a tensor of the same shape and dtype.
    """
    raise NotImplementedError("your code here")
'''

HINT_VALUES = ("Check each pass on its own: after the reduce-scatter every rank should own one fully summed "
               "chunk (which one depends on your schedule), and the all-gather then only copies finished chunks "
               "around the ring.")
HINT_CHUNKS = ("Some chunks hold the sum and others do not: usually a chunk index that is off by one in one of "
               "the passes. Write down, for W = 3, which chunk each rank sends and which it adds into (or "
               "stores) at every step of each pass, and compare that table with your loop.")
HINT_COPY_BACK = ("The sum was computed, but the caller's tensor did not change. If you work on a flat copy "
                  "(reshape and contiguous() copy when they must), copy the result back with tensor.copy_(...); "
                  "a view, tensor.view(-1), changes the caller's tensor directly.")
HINT_NOTHING_ARRIVED = ("The tensor passed in came back as it went in: no sum reached it. Do both passes run "
                        "(W-1 steps each), and does what arrives get added into (then stored in) the tensor "
                        "the caller holds, or one of its views?")
HINT_RETURN = "Return the tensor you were given (the one that now holds the sum)."
HINT_TRAFFIC = ("A ring all-reduce sends 2(W-1) chunks per rank: (W-1) in the reduce-scatter and (W-1) in the "
                "all-gather. Sending whole tensors, or everything to one rank, costs more.")


def _chunk_listing(indices: list[int]) -> str:
    names = [str(i) for i in indices]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _diagnose(mine, before, out, total, world: int) -> None:
    """Why ``mine`` does not hold the sum, as precisely as its chunks tell; raises Fail."""
    returned_sum = isinstance(out, torch.Tensor) and out.shape == total.shape and torch.equal(out, total)
    if torch.equal(mine, before) and world > 1:
        if returned_sum:
            raise Fail("the returned tensor holds the sum, but the tensor passed in was not changed: the sum "
                       "has to end up in it (in place)", hint=HINT_COPY_BACK)
        raise Fail("the tensor passed in was not changed: the sum has to end up in it (in place)",
                   hint=HINT_NOTHING_ARRIVED)
    flat, want = mine.reshape(-1), total.reshape(-1)
    bounds = chunk_bounds(flat.numel(), world)
    wrong = [i for i, (a, b) in enumerate(bounds) if b > a and not torch.equal(flat[a:b], want[a:b])]
    filled = [i for i, (a, b) in enumerate(bounds) if b > a]
    if wrong and len(wrong) < len(filled):
        raise Fail(f"on this rank, chunk{'s' if len(wrong) > 1 else ''} {_chunk_listing(wrong)} of {world} "
                   f"(as chunk_bounds({flat.numel()}, {world}) cuts the tensor) differ from the sum; the other "
                   f"chunks hold it", hint=HINT_CHUNKS)
    raise Fail("the tensor's values differ from the sum over ranks in every chunk", hint=HINT_VALUES)


def all_reduce_case(ctx, numel, dtype, seed, shape=None, traffic=False, repeat=1, transposed=False):
    for round_ in range(repeat):
        mine_seed = secret_seed(ctx, seed + 100 * round_)  # a fresh salt each round
        mine = rank_data(mine_seed, ctx.rank, numel, dtype, shape)
        mine = mine.t() if transposed else mine
        before = mine.clone()
        sent = ctx.sent_elements()
        out = ctx.call("ring_all_reduce", mine)
        sent = ctx.sent_elements() - sent
        total = sum_over_ranks(everyones(ctx, mine_seed), ctx.world, numel, dtype, shape)  # only now: common.py
        total = total.t() if transposed else total
        if not torch.equal(mine, total):
            _diagnose(mine, before, out, total, ctx.world)
        if out is not None and not (isinstance(out, torch.Tensor) and out.shape == total.shape
                                    and torch.equal(out, total)):
            raise Fail("the tensor passed in is right, but the returned value is not it: return `tensor`",
                       hint=HINT_RETURN)
        if traffic:
            check_ring_traffic(ctx, sent, numel, passes=2)


f32, f64, f16, bf16, i64 = torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64

CHECKS = (
    Check("W=1, 7 elements, float32", 1, 1, partial(all_reduce_case, numel=7, dtype=f32, seed=21)),
    Check("W=2, 8 elements, float32, in place", 2, 2, partial(all_reduce_case, numel=8, dtype=f32, seed=22)),
    Check("W=3, 10 elements (3 does not divide 10), float32", 2, 3,
          partial(all_reduce_case, numel=10, dtype=f32, seed=23)),
    Check("W=2, a 3x4 matrix, float64", 1, 2, partial(all_reduce_case, numel=12, dtype=f64, seed=24, shape=(3, 4))),
    Check("W=3, 300 elements: sends 2(W-1)/W of the tensor per rank, like a ring", 2, 3,
          partial(all_reduce_case, numel=300, dtype=f32, seed=25, traffic=True), hint=HINT_TRAFFIC),
    Check("larger world, odd length, integers", 2, 4, partial(all_reduce_case, numel=11, dtype=i64, seed=26),
          hidden=True),
    Check("fewer elements than ranks", 1, 4, partial(all_reduce_case, numel=3, dtype=f64, seed=27),
          hidden=True),
    Check("a matrix in half precision", 1, 3,
          partial(all_reduce_case, numel=35, dtype=f16, seed=28, shape=(5, 7)), hidden=True),
    Check("bfloat16, odd length", 1, 2, partial(all_reduce_case, numel=9, dtype=bf16, seed=29),
          hidden=True),
    Check("larger world, traffic of a ring", 2, 4,
          partial(all_reduce_case, numel=1000, dtype=f32, seed=30, traffic=True), hidden=True,
          hint=HINT_TRAFFIC),
    Check("called several times in a row", 1, 4,
          partial(all_reduce_case, numel=17, dtype=f32, seed=31, repeat=3), hidden=True,
          hint="Nothing may carry over from one call to the next (a buffer kept between calls, say)."),
    Check("a non-contiguous view (a transposed matrix)", 1, 3,
          partial(all_reduce_case, numel=20, dtype=f32, seed=32, shape=(4, 5), transposed=True), hidden=True),
)

EXERCISE = Exercise(
    id="02", stem="02_ring_all_reduce", title="Ring all-reduce", names=("ring_all_reduce",), stub=STUB,
    checks=CHECKS, hint=HINT_VALUES, **no_collectives(),
    rule="this exercise asks you to build the all-reduce from send/recv, and your code uses a built-in collective",
)
