"""Exercise 06: 8-bit quantisation with one scale per chunk, and error feedback.

``quantize`` / ``dequantize`` are held to the properties that make the scheme work rather than to one
implementation: int8 output, one float32 scale per chunk, every element within half a step of its
value, the full -127..127 range used (a looser scale wastes precision), no NaN from an all-zero chunk.
``compress_with_feedback`` must remember exactly what quantisation lost, and the point of doing so is
checked directly: over many steps of the same gradient, the decoded messages add up to the true sum to
within one step - without feedback the same error repeats every step and the sum drifts linearly.
On real ranks, every rank decodes every other rank's message (the grader all-gathers them).
"""
from __future__ import annotations

import math
from functools import partial

import torch

from ..spec import Check, Exercise, Fail
from .common import everyones, expect_codes, secret_seed

STUB = '''\
import torch


def quantize(x, chunk):
    """Encode a float tensor as int8 with one scale per `chunk` consecutive elements (of x flattened).

    Per chunk: scale = max|x| / 127 (for an all-zero chunk any positive scale, e.g. 1.0), and
    q = round(x / scale), which lies in -127..127. The last chunk may be shorter than `chunk`.
    Returns (q, scales): q is 1-D int8 with x.numel() elements, scales is float32, one per chunk.
    """
    raise NotImplementedError("your code here")


def dequantize(q, scales, chunk):
    """Decode: element i is q[i] * scales[i // chunk]. Returns a 1-D float32 tensor."""
    raise NotImplementedError("your code here")


def compress_with_feedback(grad, residual, chunk):
    """Error feedback: quantize grad + residual, and remember what the quantisation lost.

    grad and residual are 1-D float32 tensors of the same length. Returns (q, scales, new_residual),
    where new_residual = (grad + residual) - dequantize(q, scales, chunk).
    """
    raise NotImplementedError("your code here")
'''


def _values(numel, seed, dtype=torch.float32, zero_chunk=None, chunk=None):
    generator = torch.Generator().manual_seed(seed % 2 ** 63)
    x = (torch.randn(numel, generator=generator) * torch.rand(numel, generator=generator) * 3).to(dtype)
    if zero_chunk is not None:
        x[zero_chunk * chunk:(zero_chunk + 1) * chunk] = 0
    return x


def _quantized(ctx, x, chunk):
    q, scales = expect_codes(ctx.call("quantize", x, chunk), "quantize", "q", x.numel(),
                             "one value per element of x", math.ceil(x.numel() / chunk),
                             "chunk (the last chunk may be shorter)")
    if not torch.isfinite(scales).all() or (scales <= 0).any():
        raise Fail("every scale should be a positive finite number (an all-zero chunk too)")
    return q, scales


def _decoded(ctx, q, scales, chunk, numel):
    out = ctx.call("dequantize", q, scales, chunk)
    if not isinstance(out, torch.Tensor) or out.dtype != torch.float32 or out.numel() != numel:
        raise Fail("dequantize should return a float32 tensor with one value per element of q")
    return out.reshape(-1)


def _steps(scales, chunk, numel):
    return scales.repeat_interleave(chunk)[:numel]


def quantize_case(ctx, props, numel, chunk, seed, dtype=torch.float32, zero_chunk=None):
    x = _values(numel, seed, dtype, zero_chunk, chunk)
    before = x.clone()
    q, scales = _quantized(ctx, x, chunk)
    if not torch.equal(x, before):
        raise Fail("quantize changed its input")
    if "range" in props:
        peaks = torch.zeros(scales.numel(), dtype=torch.int64).scatter_reduce(
            0, torch.arange(numel) // chunk, q.to(torch.int64).abs(), "amax")
        nonzero = torch.zeros(scales.numel()).scatter_reduce(0, torch.arange(numel) // chunk,
                                                              x.float().abs(), "amax") > 0
        if (peaks[nonzero] != 127).any():
            raise Fail("in some chunk the largest |q| is not 127: the scale should be max|x| / 127 so that "
                       "the chunk uses the whole int8 range")
    if "error" in props:
        decoded = _decoded(ctx, q, scales, chunk, numel)
        if not torch.isfinite(decoded).all():
            raise Fail("the decoded values contain NaN or inf")
        error = (decoded.double() - x.double()).abs()
        if (error > _steps(scales, chunk, numel).double() * (0.5 + 1e-4) + 1e-6).any():
            raise Fail("an element decodes more than half a step (scale / 2) away from its value: round to "
                       "the nearest integer, do not truncate")


def dequantize_case(ctx, numel, chunk, seed):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randint(-127, 128, (numel,), generator=generator, dtype=torch.int8)
    scales = torch.rand(math.ceil(numel / chunk), generator=generator) + 0.01
    out = _decoded(ctx, q, scales, chunk, numel)
    if not torch.allclose(out, q.float() * _steps(scales, chunk, numel), rtol=1e-6, atol=0):
        raise Fail("dequantize(q, scales, chunk) should give q[i] * scales[i // chunk] for every element i")


def feedback_case(ctx, props, numel, chunk, seed, steps=50, varying=False):
    generator = torch.Generator().manual_seed(seed)
    grad = torch.randn(numel, generator=generator)
    residual = torch.randn(numel, generator=generator) * 0.01
    if "residual" in props:
        result = ctx.call("compress_with_feedback", grad.clone(), residual.clone(), chunk)
        if not isinstance(result, tuple) or len(result) != 3:
            raise Fail("compress_with_feedback should return (q, scales, new_residual)")
        q, scales, new = result
        decoded = _decoded(ctx, q, scales, chunk, numel)
        if not isinstance(new, torch.Tensor) or new.numel() != numel:
            raise Fail("new_residual should be a tensor with one value per gradient element")
        if not torch.allclose(new.reshape(-1), (grad + residual) - decoded, atol=1e-6):
            raise Fail("new_residual should be (grad + residual) - dequantize(q, scales, chunk): what "
                       "quantisation lost this time")
    if "sum" in props:
        residual, sent, true = torch.zeros(numel), torch.zeros(numel, dtype=torch.float64), torch.zeros(
            numel, dtype=torch.float64)
        last_scales = None
        for step in range(steps):
            g = grad * (1 + 0.5 * math.sin(step)) if varying else grad
            q, last_scales, residual = ctx.call("compress_with_feedback", g.clone(), residual, chunk)
            sent += _decoded(ctx, q, last_scales, chunk, numel).double()
            true += g.double()
        bound = _steps(last_scales, chunk, numel).double() * 0.51 + 1e-4
        if ((sent - true).abs() > bound).any():
            raise Fail("over many steps the decoded messages drift away from the sum of the true gradients: "
                       "the residual has to be added to the next gradient before quantising")


def ranks_case(ctx, numel, chunk, seed):
    """On real ranks: every rank decodes every rank's message; the average is within half a step."""
    mine_seed = secret_seed(ctx, seed * 10)  # the same public seed on every rank: common.py
    x = _values(numel, mine_seed)
    q, scales = _quantized(ctx, x, chunk)
    all_q = ctx.all_gather(q)              # the grader's own communication
    all_scales = ctx.all_gather(scales)
    decoded = sum(_decoded(ctx, a, b, chunk, numel).double() for a, b in zip(all_q, all_scales)) / ctx.world
    true = sum(_values(numel, s).double() for s in everyones(ctx, mine_seed)) / ctx.world
    bound = sum(_steps(b, chunk, numel).double() for b in all_scales) / ctx.world * (0.5 + 1e-4) + 1e-6
    if ((decoded - true).abs() > bound).any():
        raise Fail("the average of every rank's decoded message is further from the true average than half "
                   "a step: each rank must be able to decode what any other rank sent")


HINT_ROUND = "torch.round(x / scale) rounds to the nearest integer; .to(torch.int8) alone truncates toward zero."
HINT_SHAPE = ("Pad x with zeros to a multiple of chunk, view it as (chunks, chunk), take amax of abs over "
              "dim 1 for the scales, and cut the padding off q again.")
HINT_FEEDBACK = "corrected = grad + residual; quantise corrected; new_residual = corrected - decoded."
Q, D, F = ("quantize",), ("dequantize",), ("compress_with_feedback",)

CHECKS = (
    Check("quantize: int8 values and one float32 scale per chunk", 1, 1,
          partial(quantize_case, props=(), numel=12, chunk=4, seed=71), uses=Q, hint=HINT_SHAPE),
    Check("round trip: every element within half a step of its value", 2, 1,
          partial(quantize_case, props=("error",), numel=1000, chunk=64, seed=72), uses=Q + D, hint=HINT_ROUND),
    Check("each chunk uses the full int8 range (scale = max|x| / 127)", 1, 1,
          partial(quantize_case, props=("range",), numel=256, chunk=32, seed=73), uses=Q, hint=HINT_SHAPE),
    Check("a last chunk shorter than the others (11 elements, chunks of 4)", 1, 1,
          partial(quantize_case, props=("error", "range"), numel=11, chunk=4, seed=74), uses=Q + D, hint=HINT_SHAPE),
    Check("dequantize: q[i] * scales[i // chunk]", 1, 1, partial(dequantize_case, numel=50, chunk=8, seed=75),
          uses=D, hint="scales.repeat_interleave(chunk)[:q.numel()] lines each scale up with its elements."),
    Check("compress_with_feedback: the new residual is what quantisation lost", 2, 1,
          partial(feedback_case, props=("residual",), numel=300, chunk=32, seed=76), uses=F, hint=HINT_FEEDBACK),
    Check("error feedback: 50 steps of one gradient add up to the true sum within one step", 2, 1,
          partial(feedback_case, props=("sum",), numel=300, chunk=32, seed=77), uses=F, hint=HINT_FEEDBACK),
    Check("W=3: every rank decodes every rank's message; the average is within half a step", 1, 3,
          partial(ranks_case, numel=500, chunk=64, seed=78), uses=Q + D, hint=HINT_ROUND),
    Check("a chunk of zeros gives no NaN or inf", 1, 1,
          partial(quantize_case, props=("error", "range"), numel=100, chunk=10, seed=79, zero_chunk=3), hidden=True,
          uses=Q + D, hint=HINT_SHAPE),
    Check("float64 input, a long tensor", 1, 1,
          partial(quantize_case, props=("error", "range"), numel=10_000, chunk=512, seed=80, dtype=torch.float64),
          hidden=True, uses=Q + D, hint=HINT_ROUND),
    Check("half-precision input", 1, 1,
          partial(quantize_case, props=("error",), numel=777, chunk=100, seed=81, dtype=torch.float16), hidden=True,
          uses=Q + D, hint=HINT_ROUND),
    Check("a chunk larger than the tensor", 1, 1,
          partial(quantize_case, props=("error", "range"), numel=5, chunk=64, seed=82), hidden=True, uses=Q + D,
          hint=HINT_SHAPE),
    Check("error feedback with a changing gradient, 200 steps", 1, 1,
          partial(feedback_case, props=("sum",), numel=200, chunk=16, seed=83, steps=200, varying=True), hidden=True,
          uses=F, hint=HINT_FEEDBACK),
    Check("another world, length and chunk size: every rank decodes every message", 1, 2,
          partial(ranks_case, numel=333, chunk=50, seed=84), hidden=True, uses=Q + D, hint=HINT_ROUND),
)

EXERCISE = Exercise(
    id="06", stem="06_int8_error_feedback", title="8-bit quantisation with error feedback",
    names=("quantize", "dequantize", "compress_with_feedback"), stub=STUB, checks=CHECKS,
    forbidden=("dpteach.sync.compressed.quantize_int8", "dpteach.sync.compressed.dequantize_int8",
               "dpteach.sync.blockwise.quantize_blocks", "dpteach.sync.blockwise.dequantize_blocks"),
    rule="this exercise asks you to write the quantiser, and your code calls dpteach's own",
)
