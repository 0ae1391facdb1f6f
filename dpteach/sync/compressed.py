"""``compressed``: send fewer bits per gradient - 8-bit integers, or 16-bit floats.

**8-bit quantisation.** Each bucket is cut into chunks of ``chunk`` elements; a chunk is sent as
int8 values ``q = round(g / s)`` with one float32 scale ``s = max|g| / 127``. Decoding gives
``q * s``, which differs from ``g`` by at most half a step, ``s / 2``, per element.

int8 values cannot be summed in int8: four ranks sending 100 each would overflow at 127. So the
ranks *all-gather* their quantised buckets and scales, and each rank decodes and averages all W
of them in float32. The price: an all-gather puts (W-1) x the message on each rank's wire, where
a ring all-reduce puts 2(W-1)/W x; 8 bits instead of 32 therefore save less as W grows (the
byte count is reported, not assumed). The other textbook answer is to reduce-scatter in a wider
type; both appear in the literature on 1-bit/8-bit SGD (Seide et al. 2014; Dettmers 2016).

**fp16 / bf16.** Cast, divide by W, all-reduce in 16 bits, cast back: half the bytes of float32
(DDP's ``fp16_compress_hook`` does the same). fp16 keeps 11 significant bits but a narrow range:
below 2^-14 it has fewer bits (subnormal numbers), its smallest is 2^-24 (about 6e-8), and values up
to half of that round to zero;
above 65504 it overflows. Gradients are mostly small, so for them the usual risk is underflow, the
reason mixed-precision training scales the loss up before backward (Micikevicius et al., 2018);
dividing by W first makes them smaller still. bf16 keeps float32's range but only 8 significant bits.

**Error feedback.** What quantisation drops this step (``g - decode(encode(g))``) is remembered
and added to the next step's gradient, so errors do not accumulate in the weights (Seide et al.
2014; Karimireddy et al., "Error Feedback Fixes SignSGD", 2019).

None of this is "mathematically identical" to single-process training: the weights drift from
the reference by a measured amount - which is the lesson of the practice question.
"""
from __future__ import annotations

import torch

from ..replica.buckets import build_buckets
from .base import GradientSync
from .blockwise import dequantize_blocks, quantize_blocks


def quantize_int8(values: torch.Tensor, chunk: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """Encode float values as int8 with one scale per ``chunk`` elements. Returns (q, scales): ``q`` as long as
    ``values`` (the last chunk's padding is not kept). The encoding is ``blockwise.py``'s, in 8 bits."""
    codes, scales = quantize_blocks(values, chunk, bits=8)
    return codes[:values.numel()], scales


def dequantize_int8(q: torch.Tensor, scales: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    padded = torch.zeros(scales.numel() * chunk, dtype=torch.int8, device=q.device)
    padded[:q.numel()] = q.reshape(-1)
    return dequantize_blocks(padded, scales, q.numel(), chunk, bits=8)


class CompressedSync(GradientSync):
    """What the four compressed strategies share; each below says only what it sends (``codec``) and whether
    it feeds back what the encoding lost."""
    name = "compressed"
    exact = False
    error_feedback = False

    def __init__(self, model, timeline, bucket_mb=1.0, first_bucket_mb=None, chunk=1024, **options):
        super().__init__(model, timeline, **options)
        self.chunk = chunk
        self.buckets = build_buckets(model, bucket_mb, first_bucket_mb)
        self.residuals = [torch.zeros_like(b.buffer) for b in self.buckets] if self.error_feedback else None

    def finish(self, step: int) -> None:
        for bucket in self.buckets:
            with self.overhead(step, "pack"):
                bucket.copy_in()
                grad = bucket.buffer
                if self.residuals is not None:
                    grad += self.residuals[bucket.index]
            sent = self._average(grad, step, bucket.index)  # also leaves the mean in grad
            if self.residuals is not None:
                self.residuals[bucket.index] = sent
            with self.overhead(step, "unpack"):
                bucket.copy_out()

    def _average(self, grad: torch.Tensor, step: int, index: int) -> torch.Tensor:
        """Replace ``grad`` by the mean over ranks of the compressed gradients; return what was lost locally.
        Encoding and decoding are spanned apart from the exchange: they are overhead, not communication."""
        if self.codec == "int8":
            with self.overhead(step, "compress"):
                q, scales = quantize_int8(grad, self.chunk)
                lost = grad - dequantize_int8(q, scales, self.chunk)
            all_q = [torch.empty_like(q) for _ in range(self.world)]
            all_scales = [torch.empty_like(scales) for _ in range(self.world)]
            with self.comm.exchange(bucket=index):
                self.comm.all_gather(all_q, q)
                self.comm.all_gather(all_scales, scales)
            with self.overhead(step, "decompress"):
                decoded = sum(dequantize_int8(a, b, self.chunk) for a, b in zip(all_q, all_scales))
                grad.copy_(decoded / self.world)
            return lost
        with self.overhead(step, "compress"):
            half = grad.to(torch.float16 if self.codec == "fp16" else torch.bfloat16)
            lost = grad - half.to(grad.dtype)
            half.div_(self.world)
        with self.comm.exchange(bucket=index):
            self.comm.all_reduce(half)
        with self.overhead(step, "decompress"):
            grad.copy_(half.to(grad.dtype))
        return lost


class Int8Sync(CompressedSync):
    name, codec, label, colour = "int8", "int8", "int8", "#C44E52"


class Int8ErrorFeedbackSync(Int8Sync):
    name, error_feedback, label, colour = "int8_ef", True, "int8 + error feedback", "#DD8452"


class Fp16Sync(CompressedSync):
    name, codec, label, colour = "fp16", "fp16", "fp16", "#55A868"


class Bf16Sync(CompressedSync):
    name, codec, label, colour = "bf16", "bf16", "bf16", "#8172B2"
