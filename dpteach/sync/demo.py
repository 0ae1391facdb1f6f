"""``demo``: decoupled momentum - each rank keeps its own momentum and sends only its fast-moving part.

Peng, Quesnelle and Kingma, "DeMo: Decoupled Momentum Optimization" (2024), Algorithm 1, and their reference
optimizer (``demo.py`` in github.com/bloc97/DeMo). Data parallelism usually averages every gradient and then
keeps one momentum for all. DeMo turns that around: the gradients are never averaged. Each rank adds its own
gradient to its own momentum ``m`` and, every step::

    m <- decay x m + g                               (decay 0.999: the momentum remembers for ~1000 steps)
    c  = DCT of m, chunk by chunk                    (chunks of 64 values, 64 x 64 blocks for a matrix)
    keep the top-k coefficients of each chunk        (by magnitude; k = 32 in the paper's runs)
    q  = inverse DCT of those k                      (the momentum's fast-moving components)
    m <- m - q                                       (what is sent leaves the momentum; the rest stays local)
    all-gather every rank's (index, value) pairs     (an all-reduce cannot add them: each rank picked others)
    Q  = inverse DCT of the coefficients, each averaged over the ranks that sent it
    w <- w - lr x sign(Q)                            (the reference steps with the sign, as signSGD)

The reference adds ``lr x g`` where this file adds ``g``: with a constant learning rate that only scales ``m``, and
changes neither which coefficients are the top-k nor the sign of their mean.

Why a DCT: the momentum of neighbouring weights moves together, so its energy sits in few coefficients of a
cosine basis (the same reason JPEG uses one); top-k of the coefficients keeps more of it than top-k of the values.
The slow components the ranks do not send keep growing in their momentum until they are large enough to be
picked; nothing is lost, only delayed.

Bytes: k pairs per chunk of c values, so a rank sends k (index + value) bytes per chunk where DDP's ring would
send 2(W-1)/W x 4 c bytes, and an all-gather hands each rank W - 1 others' pairs. The course sends indices as
int16 (a chunk has at most 4096 coefficients); the reference sends torch.topk's int64 indices. A chunk size that
does not divide a dimension is lowered to its largest divisor below it, as the reference does.
"""
from __future__ import annotations

import math

import torch

from .base import GradientSync
from .knobs import Knob


def dct_matrix(n: int) -> torch.Tensor:
    """The orthonormal DCT-II as an n x n matrix: ``C @ x`` transforms, ``C.T @ y`` transforms back."""
    k = torch.arange(n, dtype=torch.float64)[:, None]
    i = torch.arange(n, dtype=torch.float64)[None, :]
    c = torch.cos(math.pi * (2 * i + 1) * k / (2 * n)) * math.sqrt(2 / n)
    c[0] /= math.sqrt(2)
    return c.to(torch.float32)


def chunk_size(length: int, target: int) -> int:
    """The largest divisor of ``length`` that is at most ``target`` (the whole length if it is smaller)."""
    return max(d for d in range(1, min(length, target) + 1) if length % d == 0)


class ChunkedDCT:
    """The DCT of one parameter's shape, chunk by chunk: a vector in chunks of c, a matrix in blocks of h x w.
    ``forward`` gives (chunks, coefficients per chunk); ``backward`` returns to the parameter's shape."""

    def __init__(self, shape, target: int, device=None):
        self.shape = tuple(shape)
        self.sizes = [chunk_size(s, target) for s in self.shape[:2]]
        self.bases = [dct_matrix(s).to(device) for s in self.sizes]
        self.per_chunk = math.prod(self.sizes)  # coefficients in one chunk
        self.chunks = math.prod(self.shape) // self.per_chunk

    def kept(self, topk: int) -> int:
        """Coefficients sent per chunk: ``topk``, or the whole chunk where it is smaller."""
        return min(topk, self.per_chunk)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(self.shape) == 1:
            (c,), (basis,) = self.sizes, self.bases
            return x.reshape(-1, c) @ basis.T
        (h, w), (bh, bw) = self.sizes, self.bases
        blocks = x.reshape(self.shape[0] // h, h, self.shape[1] // w, w).permute(0, 2, 1, 3)  # (Y, X, h, w)
        return (bh @ blocks @ bw.T).reshape(-1, h * w)

    def backward(self, coefficients: torch.Tensor) -> torch.Tensor:
        if len(self.shape) == 1:
            return (coefficients @ self.bases[0]).reshape(self.shape)
        (h, w), (bh, bw) = self.sizes, self.bases
        blocks = coefficients.reshape(self.shape[0] // h, self.shape[1] // w, h, w)
        return (bh.T @ blocks @ bw).permute(0, 2, 1, 3).reshape(self.shape)


PAIR_BYTES = 2 + 4  # an int16 index and a float32 value


def pairs_bytes(shapes, chunk: int, topk: int) -> int:
    """What one rank's (index, value) pairs weigh, for parameters of these ``shapes``: k pairs per chunk."""
    return sum(d.chunks * d.kept(topk) * PAIR_BYTES for d in (ChunkedDCT(shape, chunk) for shape in shapes))


class DeMo(GradientSync):
    name = "demo"
    label = "DeMo (top-k of the momentum's DCT)"
    colour = "#64B5CD"
    exact = False
    emulates_peers = False  # each rank's pairs differ: one rank cannot stand for the others'
    knobs = (Knob("demo_chunk", 64, "DCT chunk length (a matrix: chunk x chunk blocks); the paper's 64", low=2),
             Knob("demo_topk", 32, "coefficients each rank sends per chunk; the paper's 32", low=1),
             Knob("demo_decay", 0.999, "how much momentum each step keeps; the paper's 0.999", kind=float, low=0,
                  high=0.9999),
             Knob("demo_lr", 0.001, "the step of the sign update, per weight", kind=float, above=0))
    main_knob = "demo_topk"

    def __init__(self, model, timeline, demo_chunk: int, demo_topk: int, demo_decay: float, demo_lr: float,
                 **options):
        super().__init__(model, timeline, **options)
        self.decay, self.lr = demo_decay, demo_lr
        self.transforms = [ChunkedDCT(p.shape, demo_chunk, p.device) for p in self.params]
        self.topk = [t.kept(demo_topk) for t in self.transforms]
        self.momentum = [torch.zeros_like(p) for p in self.params]  # this rank's own, never averaged

    def make_optimizer(self, build):
        """Plain SGD on the signs DeMo leaves in ``.grad``: no momentum of its own (DeMo's is in ``finish``)."""
        return torch.optim.SGD(self.params, lr=self.lr, momentum=0.0)

    def held_tensors(self) -> list:
        return super().held_tensors() + self.momentum

    def finish(self, step: int) -> None:
        with torch.no_grad():
            with self.overhead(step, "extract"):
                indices, values = [], []
                for p, m, dct, k in zip(self.params, self.momentum, self.transforms, self.topk):
                    m.mul_(self.decay).add_(p.grad)
                    coefficients = dct.forward(m)
                    index = coefficients.abs().topk(k, dim=1, sorted=False).indices
                    value = coefficients.gather(1, index)
                    m.sub_(dct.backward(torch.zeros_like(coefficients).scatter_(1, index, value)))
                    indices.append(index.to(torch.int16).reshape(-1))
                    values.append(value.reshape(-1))
                mine_index, mine_value = torch.cat(indices), torch.cat(values)
            # gloo has no int16 collectives: the indices travel as their bytes, two per index
            every_index = mine_index.new_empty(mine_index.numel() * self.world)
            every_value = mine_value.new_empty(mine_value.numel() * self.world)
            with self.comm.exchange("all_gather"):
                self.comm.all_gather_into_tensor(every_index.view(torch.uint8), mine_index.view(torch.uint8))
                self.comm.all_gather_into_tensor(every_value, mine_value)
            with self.overhead(step, "decode"):
                every_index = every_index.view(self.world, -1).long()
                every_value = every_value.view(self.world, -1)
                start = 0
                for p, dct, k in zip(self.params, self.transforms, self.topk):
                    chunks = dct.chunks
                    n = chunks * k
                    index = every_index[:, start:start + n].reshape(self.world, chunks, k)
                    value = every_value[:, start:start + n].reshape(self.world, chunks, k)
                    index = index.permute(1, 0, 2).reshape(chunks, -1)  # every rank's picks, chunk by chunk
                    value = value.permute(1, 0, 2).reshape(chunks, -1)
                    mean = torch.zeros(chunks, dct.per_chunk, dtype=value.dtype, device=value.device)
                    mean.scatter_reduce_(1, index, value, reduce="mean", include_self=False)  # over who sent it
                    p.grad.copy_(dct.backward(mean).sign_())
                    start += n
