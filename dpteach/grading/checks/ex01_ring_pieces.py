"""Exercise 01: ring reduce-scatter and ring all-gather, from send and receive only.

The two halves of a ring all-reduce, written separately so each can be checked on its own:
``reduce_scatter(tensor) -> chunk`` and ``all_gather(chunk, numel) -> tensor``, with the chunk
layout of ``dpteach.collectives.chunk_bounds`` (rank r owns chunk r). Checks cover worlds of 1 to 4
ranks, lengths that W does not divide, fewer elements than ranks (empty chunks), six dtypes, and the
traffic: a reduce-scatter that sends each rank's whole tensor to everyone gives the right numbers
but is not a ring.
"""
from __future__ import annotations

from functools import partial

import torch

from ...collectives import chunk_bounds
from ..spec import Check, Exercise, Fail, no_collectives
from .common import (check_ring_traffic, everyones, expect_dtype, expect_tensor, rank_data, secret_seed, sum_over_ranks, unchanged,
                     which_chunk)

STUB = '''\
import torch
import torch.distributed as dist
from dpteach.collectives import chunk_bounds, exchange


def reduce_scatter(tensor):
    """Sum `tensor` (1-D, same length on every rank) over all ranks; return this rank's chunk.

    Rank r returns chunk r of chunk_bounds(tensor.numel(), W), summed over all ranks, as a new
    1-D tensor with the input's dtype. `tensor` itself must be left unchanged.
    """
    raise NotImplementedError("your code here")


def all_gather(chunk, numel):
    """Every rank passes its chunk (chunk r of chunk_bounds(numel, W) on rank r); return them all.

    Returns a new 1-D tensor of `numel` elements on every rank: the chunks, in rank order.
    """
    raise NotImplementedError("your code here")
'''

HINT_VALUES = ("Walk the 3-rank example in dpteach/collectives/ring.py by hand: which chunk does each rank "
               "send at each step, which does it add into, and which does it own at the end?")
HINT_LENGTH = ("chunk_bounds(n, W) gives the first n % W chunks one extra element; with n < W the last "
               "chunks are empty, and an empty chunk still has to be returned (and sent: as nothing).")
HINT_TRAFFIC = ("A ring sends one chunk per step, W-1 steps per pass: (W-1)/W of the tensor per rank. "
                "Sending the whole tensor, or sending to every rank, is not a ring.")


def reduce_scatter_case(ctx, numel, dtype, seed, traffic=False):
    mine_seed = secret_seed(ctx, seed)
    mine = rank_data(mine_seed, ctx.rank, numel, dtype)
    before = mine.clone()
    sent = ctx.sent_elements()
    out = ctx.call("reduce_scatter", mine)
    sent = ctx.sent_elements() - sent
    total = sum_over_ranks(everyones(ctx, mine_seed), ctx.world, numel, dtype)  # only now: see common.py
    out = expect_tensor(out, "the result of reduce_scatter")
    start, stop = chunk_bounds(numel, ctx.world)[ctx.rank]
    expect_dtype(out, dtype, "the returned chunk")
    if out.numel() != stop - start:
        raise Fail("the returned chunk has the wrong number of elements: rank r returns chunk r of "
                   "chunk_bounds(numel, W)")
    if not torch.equal(out.reshape(-1), total[start:stop]):
        other = which_chunk(out, total, ctx.world)
        if other is not None:
            raise Fail(f"the returned chunk is the summed chunk {other}, not chunk {ctx.rank}: the chunk "
                       f"indices are off")
        if torch.equal(out.reshape(-1), mine[start:stop]):
            raise Fail("the returned chunk holds only this rank's own values: nothing was added")
        raise Fail("the returned chunk's values differ from chunk r of the sum over ranks")
    unchanged(before, mine, "the input tensor")
    if traffic:
        check_ring_traffic(ctx, sent, numel, passes=1)


def _chunks(seeds, world, numel, dtype):
    """Every rank's chunk, each cut from a vector drawn from that rank's own seed, in rank order."""
    return torch.cat([rank_data(seeds, r, numel, dtype)[a:b] for r, (a, b) in enumerate(chunk_bounds(numel, world))])


def all_gather_case(ctx, numel, dtype, seed, traffic=False):
    mine_seed = secret_seed(ctx, seed)
    start, stop = chunk_bounds(numel, ctx.world)[ctx.rank]
    chunk = rank_data(mine_seed, ctx.rank, numel, dtype)[start:stop].clone()
    before = chunk.clone()
    sent = ctx.sent_elements()
    out = ctx.call("all_gather", chunk, numel)
    sent = ctx.sent_elements() - sent
    total = _chunks(everyones(ctx, mine_seed), ctx.world, numel, dtype)  # only now: see common.py
    out = expect_tensor(out, "the result of all_gather")
    expect_dtype(out, dtype, "the gathered tensor")
    if out.numel() != numel:
        raise Fail("the gathered tensor has the wrong number of elements: it must hold all `numel`")
    if not torch.equal(out.reshape(-1), total):
        if torch.equal(out.reshape(-1)[start:stop], total[start:stop]):
            raise Fail("this rank's own chunk is in place but other chunks are missing or in the wrong place")
        raise Fail("the gathered tensor's values differ from the chunks the ranks passed in, in rank order")
    unchanged(before, chunk, "the chunk passed in")
    if traffic:
        check_ring_traffic(ctx, sent, numel, passes=1)


def round_trip_case(ctx, numel, dtype, seed):
    mine_seed = secret_seed(ctx, seed)
    mine = rank_data(mine_seed, ctx.rank, numel, dtype)
    chunk = expect_tensor(ctx.call("reduce_scatter", mine), "the result of reduce_scatter")
    out = ctx.call("all_gather", chunk, numel)
    total = sum_over_ranks(everyones(ctx, mine_seed), ctx.world, numel, dtype)
    out = expect_tensor(out, "the result of all_gather")
    if out.dtype != dtype or out.numel() != numel or not torch.equal(out.reshape(-1), total):
        raise Fail("all_gather(reduce_scatter(x), n) is not the all-reduce (the sum over ranks) of x")


RS, AG, BOTH = ("reduce_scatter",), ("all_gather",), ("reduce_scatter", "all_gather")
f32, f64, f16, bf16, i64, i32 = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
                                  torch.int32)

CHECKS = (
    Check("reduce_scatter: W=1, 5 elements, float32", 1, 1, partial(reduce_scatter_case, numel=5, dtype=f32, seed=1),
          uses=RS, hint=HINT_VALUES),
    Check("reduce_scatter: W=2, 8 elements, float32", 2, 2, partial(reduce_scatter_case, numel=8, dtype=f32, seed=2),
          uses=RS, hint=HINT_VALUES),
    Check("reduce_scatter: W=3, 10 elements (3 does not divide 10), float32; input unchanged", 2, 3,
          partial(reduce_scatter_case, numel=10, dtype=f32, seed=3), uses=RS, hint=HINT_LENGTH),
    Check("reduce_scatter: W=3, 300 elements, sends only W-1 chunks per rank", 2, 3,
          partial(reduce_scatter_case, numel=300, dtype=f32, seed=4, traffic=True), uses=RS, hint=HINT_TRAFFIC),
    Check("all_gather: W=2, 8 elements, float32", 2, 2, partial(all_gather_case, numel=8, dtype=f32, seed=5),
          uses=AG, hint=HINT_VALUES),
    Check("all_gather: W=3, 10 elements, float32", 2, 3, partial(all_gather_case, numel=10, dtype=f32, seed=6),
          uses=AG, hint=HINT_LENGTH),
    Check("all_gather(reduce_scatter(x)) is the all-reduce: W=3, 12 elements, float64", 1, 3,
          partial(round_trip_case, numel=12, dtype=f64, seed=7), uses=BOTH, hint=HINT_VALUES),
    Check("reduce_scatter, larger world, odd length, integers", 2, 4,
          partial(reduce_scatter_case, numel=11, dtype=i64, seed=8), hidden=True, uses=RS, hint=HINT_LENGTH),
    Check("reduce_scatter, fewer elements than ranks, half precision", 1, 4,
          partial(reduce_scatter_case, numel=3, dtype=f16, seed=9), hidden=True, uses=RS, hint=HINT_LENGTH),
    Check("all_gather, larger world, odd length, bfloat16", 2, 4,
          partial(all_gather_case, numel=13, dtype=bf16, seed=10), hidden=True, uses=AG, hint=HINT_LENGTH),
    Check("all_gather, fewer elements than ranks, int32", 1, 4,
          partial(all_gather_case, numel=2, dtype=i32, seed=11), hidden=True, uses=AG, hint=HINT_LENGTH),
    Check("all_gather, larger world, sends only W-1 chunks per rank", 1, 4,
          partial(all_gather_case, numel=1001, dtype=f32, seed=12, traffic=True), hidden=True, uses=AG,
          hint=HINT_TRAFFIC),
    Check("reduce_scatter then all_gather, larger world, long tensor", 1, 4,
          partial(round_trip_case, numel=4099, dtype=f64, seed=13), hidden=True, uses=BOTH, hint=HINT_VALUES),
)

EXERCISE = Exercise(
    id="01", stem="01_ring_reduce_scatter_all_gather", title="Ring reduce-scatter and all-gather",
    names=("reduce_scatter", "all_gather"), stub=STUB, checks=CHECKS,
    **no_collectives(),
    rule="this exercise asks you to build the collectives from send/recv, and your code uses a built-in one",
)
