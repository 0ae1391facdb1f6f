"""What several exercises' checks share: test data, and turning a wrong answer into a message.

**Exact data.** Every rank's tensor holds small integers (-20..20; 0..20 for unsigned types), stored in
the dtype under test. Sums of up to four of them are exact in every dtype the course uses - bfloat16
included, whose 8-bit mantissa is exact up to 256 - so the checks compare with ``torch.equal`` and no
tolerance: the order in which a ring adds the contributions cannot matter, and a wrong answer cannot
hide inside a tolerance.

**Every rank knows every rank's data** (it is drawn from ``seed`` and the rank number), so each rank
computes the expected result locally. The grader needs no collective of its own to know the answer,
and nothing it does can be confused with the learner's communication.
"""
from __future__ import annotations

import torch

from ...collectives import chunk_bounds
from ..spec import Fail

DTYPE_NAMES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
               torch.bfloat16: "bfloat16", torch.int64: "int64", torch.int32: "int32", torch.int8: "int8",
               torch.uint8: "uint8"}


def rank_data(seed: int, rank: int, numel: int, dtype: torch.dtype, shape=None) -> torch.Tensor:
    """Rank ``rank``'s tensor for case ``seed``: small integers, exact in ``dtype``."""
    generator = torch.Generator().manual_seed(seed * 7919 + rank * 104729 + numel)
    values = torch.randint(-20, 21, (numel,), generator=generator)
    if dtype == torch.uint8:
        values = values.abs()
    values = values.to(dtype)
    return values.reshape(shape) if shape is not None else values


def sum_over_ranks(seed: int, world: int, numel: int, dtype: torch.dtype, shape=None) -> torch.Tensor:
    """The sum of every rank's ``rank_data``, computed exactly (in int64) and stored in ``dtype``."""
    parts = [rank_data(seed, r, numel, torch.int64) for r in range(world)]
    if dtype == torch.uint8:
        parts = [part.abs() for part in parts]
    total = torch.stack(parts).sum(0).to(dtype)
    return total.reshape(shape) if shape is not None else total


def expect_tensor(value, what: str) -> torch.Tensor:
    """``value`` must be a tensor; otherwise a message naming what was returned."""
    if not isinstance(value, torch.Tensor):
        raise Fail(f"{what} should be a torch.Tensor, but it is {type(value).__name__}")
    return value


def expect_dtype(value: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    if value.dtype != dtype:
        raise Fail(f"{what} has dtype {DTYPE_NAMES.get(value.dtype, value.dtype)}, but the input was "
                   f"{DTYPE_NAMES.get(dtype, dtype)}: keep the input's dtype")


def which_chunk(value: torch.Tensor, total: torch.Tensor, world: int) -> int | None:
    """If ``value`` equals another chunk of ``total``, which one (to diagnose an off-by-one index)."""
    flat = value.reshape(-1)
    for index, (start, stop) in enumerate(chunk_bounds(total.numel(), world)):
        if stop - start == flat.numel() and flat.numel() > 0 and torch.equal(flat, total[start:stop]):
            return index
    return None


def unchanged(before: torch.Tensor, after: torch.Tensor, what: str) -> None:
    if not torch.equal(before, after):
        raise Fail(f"{what} was changed; leave the input as it was (work on a copy)")
