"""Exercise 11: a block-quantised all-gather - ZeRO++'s qwZ, every rank's shard sent as int8 with a scale per block.

ZeRO-3 all-gathers each layer's weights before using them; ZeRO++ (Wang et al., "ZeRO++: Extremely Efficient
Collective Communication for Giant Model Training", 2023; its qwZ) sends that all-gather in int8. One
scale for a whole shard would let a single large weight coarsen the step of every other: the paper cuts the
shard into blocks with a scale each, so an outlier costs precision in its own block only. The learner writes
``quantize_blocks``, ``dequantize_blocks`` and ``quantized_all_gather``; ``dpteach/sync/blockwise.py`` is the
oracle the checks compare with (the learner may not call it).

What is judged, and why each piece:

* **the encoding** (one rank, no messages): int8 codes padded with zeros to whole blocks, and the scales
  themselves, ``max|block| / 127`` (1 for an all-zero block) - compared with the oracle's, because a single
  scale for the whole tensor still has the right shape and lies within *its own* half step;
* **the values** of the all-gather: every element within half of *its block's* step (the oracle's scale, not
  the learner's), and every rank holding bitwise the same tensor - the replicas compute with these weights, so
  a rank that keeps its own piece in float32 would drift from the others;
* **the bytes**: what reached the rank through the check's process group while the call ran, counted by the
  kernel on gloo's sockets (``network/traffic.py``), must be close to W-1 int8 pieces with their scales and
  clearly below a float32 all-gather. Values alone cannot tell int8 from float32 on the wire: a float32
  all-gather is exact, so every all-gather check counts the bytes too. Below a floor (a byte per value of
  every other rank), the data did not travel as messages at all.

Each rank's shard is drawn from its own secret salt and has an outlier in one block (``common.py``): nobody
knows the concatenation before the messages arrive, and a single scale fails everywhere. The grader's barrier
before the call keeps a fast peer's bytes from arriving before this rank starts counting.
"""
from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist

from ...sync.blockwise import dequantize_blocks, encoded_bytes, error_bound, quantize_blocks
from ..spec import TORCH_COLLECTIVES, Check, Exercise, Fail, observes
from .common import everyones, expect_codes, require_received, secret_seed

STUB = '''\
import torch
import torch.distributed as dist


def quantize_blocks(x, block):
    """x: a 1-D float32 tensor. Cut it into blocks of `block` values (the last one padded with zeros)
    and encode each block symmetrically: scale = max|block| / 127 (1.0 for an all-zero block) and
    codes = round(x / scale), clamped to -127..127.
    Returns (codes, scales): codes is 1-D int8, ceil(x.numel() / block) * block long (the padding's
    codes are 0); scales is 1-D float32, one per block.
    """
    raise NotImplementedError("your code here")


def dequantize_blocks(codes, scales, numel, block):
    """The first `numel` values that `codes` and `scales` encode: codes[i] * scales[i // block], float32."""
    raise NotImplementedError("your code here")


def quantized_all_gather(shard, block):
    """shard: this rank's 1-D float32 tensor, the same length on every rank. Quantise it, all-gather every
    rank's codes and scales through torch.distributed, and dequantise every piece (your own too).
    Returns a 1-D float32 tensor of W * shard.numel() values: rank r's piece at [r * n, (r + 1) * n).
    """
    raise NotImplementedError("your code here")
'''

# The ceiling on what a rank may receive, per peer: its piece's codes and scales a quarter over, and 1.5 kB for
# the rest - gloo's headers (about 300 bytes a collective), the grader's barrier, lengths exchanged first (the
# course's ring_all_gather, two of them: about 950 bytes in all). A float32 piece is 4 bytes a value.
SLACK, PER_PEER = 1.25, 1536


def shard(seed: int, numel: int, block: int, zero_block=None) -> torch.Tensor:
    """One rank's shard: values of about 1, one outlier of 30-60 in a block of its own, and optionally an all-zero
    block - the outlier is what sets a block-quantiser apart from one scale for the whole tensor."""
    generator = torch.Generator().manual_seed(seed % 2 ** 63)
    x = torch.randn(numel, generator=generator) * (0.5 + torch.rand(numel, generator=generator))
    blocks = -(-numel // block)
    if zero_block is not None:
        x[zero_block * block:(zero_block + 1) * block] = 0
    others = [b for b in range(blocks) if b != zero_block]
    where = others[int(torch.randint(len(others), (1,), generator=generator))]
    start, stop = where * block, min((where + 1) * block, numel)
    spot = start + int(torch.randint(stop - start, (1,), generator=generator))
    sign = 1.0 if torch.rand(1, generator=generator).item() < 0.5 else -1.0
    x[spot] = sign * (30 + 30 * torch.rand(1, generator=generator).item())
    return x


def _encoded(ctx, x, block):
    """The learner's (codes, scales) for ``x``, held to the shape the wire needs."""
    blocks = -(-x.numel() // block)
    return expect_codes(ctx.call("quantize_blocks", x, block), "quantize_blocks", "codes", blocks * block,
                        "the last block padded with zeros: ceil(numel / block) * block values", blocks,
                        "block (the last, padded block too)")


def _decoded(ctx, codes, scales, numel, block):
    out = ctx.call("dequantize_blocks", codes, scales, numel, block)
    if not isinstance(out, torch.Tensor) or out.dtype != torch.float32 or out.numel() != numel:
        raise Fail("dequantize_blocks should return a float32 tensor of numel values (the padding cut off)")
    return out.reshape(-1)


def _within_half_a_step(values, true, block) -> torch.Tensor:
    """Per element: is it within half of its block's step (the oracle's scale of ``true``) of the true value?"""
    bound = error_bound(quantize_blocks(true, block)[1], block, true.numel()).double() * (1 + 1e-4) + 1e-6
    return (values.double() - true.double()).abs() <= bound


def quantize_case(ctx, props, numel, block, seed, zero_block=None):
    x = shard(secret_seed(ctx, seed), numel, block, zero_block)
    before = x.clone()
    codes, scales = _encoded(ctx, x, block)
    if not torch.equal(x, before):
        raise Fail("quantize_blocks changed its input: quantise a copy")
    want_codes, want_scales = quantize_blocks(x, block)
    if not torch.isfinite(scales).all() or (scales <= 0).any():
        raise Fail("every scale should be a positive finite number: an all-zero block gets scale 1")
    if "codes" in props:
        zero = want_scales == 1
        if not torch.allclose(scales[zero], want_scales[zero], rtol=0, atol=0):
            raise Fail("an all-zero block should get scale 1 (any scale encodes zeros; the exercise asks for 1)")
        if not torch.allclose(scales, want_scales, rtol=1e-6, atol=0):
            raise Fail("a scale differs from max|block| / 127 of its own block: each block of `block` values gets "
                       "its own scale - one scale for the whole tensor lets one large value coarsen every block")
        if (codes[numel:] != 0).any():
            raise Fail("the padding after the last value should be encoded as zeros")
        if ((codes.to(torch.int16) - want_codes.to(torch.int16)).abs() > 1).any():
            raise Fail("some codes are not round(x / scale) of their block's scale")
    if "error" in props:
        decoded = _decoded(ctx, codes, scales, numel, block)
        if not torch.isfinite(decoded).all():
            raise Fail("the decoded values contain NaN or inf")
        if not _within_half_a_step(decoded, x, block).all():
            raise Fail("a value decodes more than half a step from where it was, with the step of its own block "
                       "(max|block| / 127): round to the nearest code, and give each block its own scale")
        theirs = _decoded(ctx, want_codes, want_scales, numel, block)
        if not torch.allclose(theirs, dequantize_blocks(want_codes, want_scales, numel, block), rtol=1e-6, atol=0):
            raise Fail("dequantize_blocks(codes, scales, numel, block) should give codes[i] * scales[i // block] for "
                       "the first numel values")


@observes
def _gather(ctx, mine, block):
    """The learner's quantized_all_gather on this rank's shard; what it returned and the bytes that arrived."""
    given = mine.clone()
    before = ctx.received_bytes()
    dist.barrier()  # every rank has read its count before any rank's code sends: see the module's docstring
    with ctx.running_learner_code():
        result = ctx.learner("quantized_all_gather")(given, block)
    after = ctx.received_bytes()
    return {"result": result, "changed": not torch.equal(given, mine),
            "received": None if after is None or before is None else after - before}


def byte_limit(world: int, numel: int, block: int) -> int:
    """The most bytes a rank may receive: W-1 pieces of codes and scales, with room for headers."""
    return int((world - 1) * (SLACK * encoded_bytes(numel, block) + PER_PEER))


def gather_case(ctx, numel, block, seed, zero_block=None):
    mine = secret_seed(ctx, seed)
    seen = ctx.drive(_gather, shard(mine, numel, block, zero_block), block)
    seeds = everyones(ctx, mine)  # only now: common.py
    total, result = ctx.world * numel, seen["result"]
    wrong = None
    if not isinstance(result, torch.Tensor) or result.dtype != torch.float32:
        wrong = "quantized_all_gather should return a float32 tensor"
    elif result.numel() != total:
        wrong = "quantized_all_gather should return W * shard.numel() values: every rank's piece, in rank order"
    result = result.reshape(-1) if wrong is None else torch.full((total,), float("nan"))
    everyone = ctx.all_gather(result)  # on every rank, whatever it returned: no rank is left waiting
    if wrong:
        raise Fail(wrong)
    if seen["changed"]:
        raise Fail("quantized_all_gather changed the shard it was given: quantise a copy")
    pieces = [shard(seed, numel, block, zero_block) for seed in seeds]
    off = [r for r, piece in enumerate(pieces)
           if not _within_half_a_step(result[r * numel:(r + 1) * numel], piece, block).all()]
    if ctx.rank in off:
        raise Fail(f"the pieces of rank(s) {off}, this rank's own among them, are more than half a step (half of "
                   f"their block's scale) from those ranks' values: give each block its own scale, max|block| / 127, "
                   f"and round to the nearest code")
    if off:
        raise Fail(f"the pieces of rank(s) {off} are more than half a step (half of their block's scale) from "
                   f"those ranks' values: each piece must be decoded with the scales of the rank that sent it")
    if not all(torch.equal(other, everyone[0]) for other in everyone):
        raise Fail("the ranks returned different tensors: decode every piece from its codes, your own too, so "
                   "that every replica computes with the same weights")
    received = seen["received"]
    if ctx.world > 1:
        require_received(ctx, received, (ctx.world - 1) * numel, "every other rank's int8 codes")
    if received is not None and received > byte_limit(ctx.world, numel, block):
        raise Fail(f"{received} bytes reached this rank while quantized_all_gather ran, where W-1 pieces of int8 "
                   f"codes with a float32 scale per block weigh {(ctx.world - 1) * encoded_bytes(numel, block)} and "
                   f"a float32 all-gather {(ctx.world - 1) * 4 * numel}: send the codes and the scales, not the "
                   f"values", hint=HINT_BYTES)


HINT_SHAPE = ("Pad x with zeros to a whole number of blocks, view it as (blocks, block), take abs().amax(dim=1) / 127 "
              "for the scales (1 where that is 0), and round(x / scale) for the codes.")
HINT_ROUND = "torch.round rounds to the nearest integer; .to(torch.int8) alone truncates toward zero."
HINT_GATHER = ("Quantise your shard, dist.all_gather the codes (int8) and the scales (float32) into lists of W tensors, "
               "then dequantize_blocks each rank's pair and torch.cat the pieces in rank order.")
HINT_BYTES = ("Put int8 codes and float32 scales into the collectives, never the float32 values; check the dtype of "
              "what you hand to dist.all_gather.")
Q, QD, A = ("quantize_blocks",), ("quantize_blocks", "dequantize_blocks"), ("quantized_all_gather",)

CHECKS = (
    Check("quantize_blocks: int8 codes padded to whole blocks, one float32 scale max|block| / 127 per block", 2, 1,
          partial(quantize_case, props=("codes",), numel=1000, block=64, seed=111), uses=Q, hint=HINT_SHAPE),
    Check("round trip: every value within half a step of its own block, one block with an outlier", 2, 1,
          partial(quantize_case, props=("error",), numel=777, block=50, seed=112), uses=QD, hint=HINT_ROUND),
    Check("an all-zero block: scale 1, zeros back, no NaN", 1, 1,
          partial(quantize_case, props=("codes", "error"), numel=300, block=32, seed=113, zero_block=2), uses=QD,
          hint=HINT_SHAPE),
    Check("quantized_all_gather, W=2: the whole tensor on every rank, within half a step, int8 on the wire", 2, 2,
          partial(gather_case, numel=1000, block=64, seed=114), uses=A),
    Check("quantized_all_gather, W=3: 1001 values per rank (not a multiple of the block), an all-zero block", 2, 3,
          partial(gather_case, numel=1001, block=64, seed=115, zero_block=3), uses=A),
    Check("quantized_all_gather, W=4: about W-1 int8 pieces and their scales received, not float32", 2, 4,
          partial(gather_case, numel=2048, block=128, seed=116), uses=A),
    Check("quantize_blocks and dequantize_blocks: a long tensor in blocks of 7", 1, 1,
          partial(quantize_case, props=("codes", "error"), numel=4999, block=7, seed=117), hidden=True, uses=QD,
          hint=HINT_SHAPE),
    Check("quantized_all_gather: another world, an odd length and block", 2, 3,
          partial(gather_case, numel=777, block=100, seed=118), hidden=True, uses=A),
    Check("quantized_all_gather: the largest world, small blocks, an all-zero block", 2, 4,
          partial(gather_case, numel=1537, block=32, seed=119, zero_block=10), hidden=True, uses=A),
    Check("quantized_all_gather: a long shard in large blocks", 1, 2,
          partial(gather_case, numel=4099, block=256, seed=120), hidden=True, uses=A),
)

EXERCISE = Exercise(
    id="11", stem="11_quantized_all_gather", title="Block-quantised all-gather (ZeRO++'s qwZ)",
    names=("quantize_blocks", "dequantize_blocks", "quantized_all_gather"), stub=STUB, checks=CHECKS,
    hint=HINT_GATHER,
    forbidden=("dpteach.sync.blockwise.quantize_blocks", "dpteach.sync.blockwise.dequantize_blocks",
               "dpteach.sync.compressed.quantize_int8", "dpteach.sync.compressed.dequantize_int8")
    + tuple(name for name in TORCH_COLLECTIVES if name.endswith(("_object", "_object_list"))),
    forbidden_modules=("dpteach.sync.blockwise", "dpteach.sync.compressed", "dpteach.sync.zeropp"),
    rule="this exercise asks you to quantise and gather tensors yourself, and your code uses dpteach's own "
         "quantiser or gathers Python objects",
)
