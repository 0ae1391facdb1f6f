"""What several exercises' checks share: test data, and turning a wrong answer into a message.

**Exact data.** Every rank's tensor holds small integers (-20..20; 0..20 for unsigned types), stored in
the dtype under test. Sums of up to four of them are exact in every dtype the course uses - bfloat16
included, whose 8-bit mantissa is exact up to 256 - so the checks compare with ``torch.equal`` and no
tolerance: the order in which a ring adds the contributions cannot matter, and a wrong answer cannot
hide inside a tolerance.

**No rank knows another rank's data before the learner's call returns.** A rank's data is drawn from the
check's seed mixed with the rank's own secret salt (:func:`secret_seed`; the parent process chose the salts
and each rank can derive only its own: ``grading/salts.py``): the seeds are public (they are in the check modules),
so data drawn from them alone would let a solution rebuild every rank's data - and the expected answer -
with no message at all. After the call, the check learns every rank's seed (:func:`everyones`: in the rank
by the grader's own all-gather, in the judge from the parent's keys, never from the rank's word) and only
then computes the expected result: nothing in the check's frame during the call gives the answer away.
"""
from __future__ import annotations

import math

import torch

from ...collectives import chunk_bounds
from ..salts import mixed  # noqa: F401 (part of this module's interface)
from ..spec import Fail

DTYPE_NAMES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
               torch.bfloat16: "bfloat16", torch.int64: "int64", torch.int32: "int32", torch.int8: "int8",
               torch.uint8: "uint8"}


def secret_seed(ctx, seed: int) -> int:
    """This rank's seed for the case: ``seed`` and a fresh salt of its own (the seed itself on one rank).

    Every rank passes the same public ``seed`` (the salts make their data differ): the judge turns one
    rank's mixed seed into every rank's from the salts alone (``salts.peers``)."""
    return ctx.secret_seed(seed)


def everyones(ctx, mine: int) -> list[int]:
    """Every rank's seed. Call it after the learner's calls, on every rank."""
    return ctx.everyones(mine)


def rank_data(seed, rank: int, numel: int, dtype: torch.dtype, shape=None) -> torch.Tensor:
    """Rank ``rank``'s tensor for case ``seed`` (one seed, or a list with every rank's): small integers,
    exact in ``dtype``."""
    own = seed[rank] if isinstance(seed, (list, tuple)) else seed
    generator = torch.Generator().manual_seed((own * 7919 + rank * 104729 + numel) % 2 ** 63)
    values = torch.randint(-20, 21, (numel,), generator=generator)
    if dtype == torch.uint8:
        values = values.abs()
    values = values.to(dtype)
    return values.reshape(shape) if shape is not None else values


def sum_over_ranks(seed, world: int, numel: int, dtype: torch.dtype, shape=None) -> torch.Tensor:
    """The sum of every rank's ``rank_data`` (``seed``: one, or every rank's), exact (in int64), in ``dtype``."""
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


def expect_codes(result, function: str, codes: str, numel: int, length: str, scales: int, per: str):
    """What a quantiser returned (exercises 06 and 11): a pair of 1-D int8 ``codes`` (the learner's name for them),
    ``numel`` of them (``length``: how many, in words), and 1-D float32 scales, ``scales`` of them, one per ``per``."""
    if not isinstance(result, tuple) or len(result) != 2:
        raise Fail(f"{function} should return a pair ({codes}, scales)")
    values, found = result
    if not isinstance(values, torch.Tensor) or values.dtype != torch.int8:
        raise Fail(f"{codes} should be an int8 tensor")
    if values.dim() != 1 or values.numel() != numel:
        raise Fail(f"{codes} should be 1-D with {length}")
    if not isinstance(found, torch.Tensor) or found.dtype != torch.float32 or found.dim() != 1:
        raise Fail("scales should be a 1-D float32 tensor")
    if found.numel() != scales:
        raise Fail(f"there should be one scale per {per}")
    return values, found


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


def require_received(ctx, received, needed: int, what: str, later: str = "") -> None:
    """``received`` bytes reached this rank through the check's process group (``ctx.received_bytes``); the
    answer needs at least ``needed`` of its peers' bytes. None passes only where the parent found, before
    any rank started, that this machine cannot count them (``ctx.counts_traffic``: not Linux); anywhere else
    a count that went missing is no count, and fails."""
    if received is None and getattr(ctx, "counts_traffic", True):
        received = 0
    if received is not None and received < needed:
        raise Fail(f"only {received} bytes reached this rank through the process group, fewer than the {needed} "
                   f"that {what} needs from its peers: the data must travel as messages (send/recv), not through "
                   f"files, the store or any other channel" + later)


def reachable_bytes(roots, params) -> int:
    """Bytes in the tensors reachable from ``roots`` (through lists, tuples, sets and dicts, a few levels deep),
    once per storage, leaving out storage shared with a parameter (the model's own weights): what an
    optimizer really holds, measured rather than asked (exercises 08 and 09)."""
    shared = {p.untyped_storage().data_ptr() for p in params}
    seen, storages, pending = set(), {}, [(value, 0) for value in roots]
    while pending:
        value, depth = pending.pop()
        if id(value) in seen or depth > 4:
            continue
        seen.add(id(value))
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            if storage.data_ptr() not in shared:
                storages[storage.data_ptr()] = storage.nbytes()
        elif isinstance(value, dict):
            pending += [(item, depth + 1) for item in value.values()]
        elif isinstance(value, (list, tuple, set, frozenset)):
            pending += [(item, depth + 1) for item in value]
    return sum(storages.values())


def check_ring_traffic(ctx, sent, numel, passes):
    """A ring pass sends W-1 chunks per rank; allow a few elements for exchanging sizes."""
    if ctx.world == 1:
        return
    limit = passes * (ctx.world - 1) * math.ceil(numel / ctx.world) + 4 * ctx.world
    if sent > limit:
        raise Fail("this rank sent more elements than a ring does: a ring sends W-1 chunks per rank and pass, "
                   "(W-1)/W of the tensor, not whole tensors and not to every rank")
    if sent == 0:
        raise Fail("this rank sent nothing with send/isend: the data must travel point to point")
