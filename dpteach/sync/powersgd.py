"""``powersgd``: send a rank-r sketch of each gradient matrix instead of the matrix (lesson 14).

A layer's gradient is a matrix M (a Linear layer's weight: n outputs x m inputs; a convolution's is
viewed as out_channels x everything else). PowerSGD (Vogels, Karimireddy, Jaggi, "PowerSGD: Practical
Low-Rank Gradient Compression for Distributed Optimization", NeurIPS 2019, Algorithm 1) sends two thin
matrices instead. One round for a 512 x 512 gradient at rank r = 4, on every rank w at once::

    Q            512 x 4   the same on every rank (drawn from a shared seed, or last step's: warm start)
    P_w = M_w Q  512 x 4   all-reduced:   P = mean_w P_w = (mean_w M_w) Q       2048 numbers
    P <- orthogonalise(P)  (its 4 columns made orthonormal: Gram-Schmidt, or QR)
    Q_w = M_w^T P 512 x 4  all-reduced:   Q = mean_w Q_w = (mean_w M_w)^T P     2048 numbers
    mean M ~ P Q^T         512 x 512, the same on every rank

(512 + 512) x 4 = 4,096 numbers travel instead of 512 x 512 = 262,144: 64 times fewer. (The course's
MLP at rank 4: 23,346 numbers a step instead of 1,089,034, 47x; its biases, 2,570, travel whole.) The trick that
makes it an all-reduce at all is linearity: M -> M Q and M -> M^T P are linear, so the mean of the
ranks' P is the P of the mean gradient (the paper's section 3; compressors such as top-k are not, and
need an all-gather). P Q^T is one step of subspace (power) iteration towards M's top r singular
vectors. **Warm start**: each step starts from the previous step's Q instead of a fresh random one, so
over the steps the iteration keeps refining the subspace of a gradient that changes slowly.

**Error feedback** (the paper's Algorithm 2): what the sketch leaves out, e_w = (M_w + e_w) - P Q^T, is
kept on each rank and added to its next gradient, so no direction is lost for good, only delayed.
(``powersgd_error_feedback=False`` switches it off: what a biased compressor drops is then lost;
torch's ``PowerSGDState`` calls error feedback "usually crucial".) The authors' later library
(github.com/epfml/powersgd) alternates M Q and M^T P between steps - one all-reduce per step instead
of two; torch's hook keeps both and notes the idea as a TODO in ``compute_qs``.

What we follow, line by line: torch's own DDP communication hook, ``powerSGD_hook`` in
``torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py`` (torch 2.13), with its
``PowerSGDState`` defaults (``min_compression_rate=2``, ``warm_start=True``, ``random_seed=0``,
``orthogonalization_epsilon=0``). ``experiments/powersgd.py`` feeds both the same gradients and
checks that they agree. In order, per bucket:

* For the first ``powersgd_start`` steps, the plain mean (torch's ``start_powerSGD_iter``, default 1000
  there; 10 here): early training is the most sensitive to a coarse gradient. (torch refuses less than 2
  with error feedback or warm start on: DDP rebuilds its buckets after step 1. Ours never change.)
* Each gradient is viewed as ``tensor.view(shape[0], -1)``; ``_should_compress`` keeps it whole unless
  (n + m) r x 2 < n m. A bias (n x 1) never passes, nor would a 10 x 8 matrix at rank 4: these are
  all-reduced as they are, in one flat message.
* The matrices are taken grouped by shape (its ``shape_to_tensors``), which fixes which random numbers
  land in which Q: the first compressing step draws ``seed = rng.randint(1_000_000_000)`` from a
  ``numpy.random.RandomState(0)`` once per bucket, seeds torch's CPU generator with it and draws each Q
  from ``torch.randn``. Every rank draws the same numbers without any message.
* ``_orthogonalize`` uses Gram-Schmidt (``_orthogonalize_gram_schmidt``) only for r <= 2 (or 16-bit
  floats) and ``torch.linalg.qr`` above; both give an orthonormal basis of the same nested column
  spans, differing at most in each column's sign, which P Q^T does not see. We do the same.
* Error feedback covers the whole bucket: torch keeps ``input - output`` for the uncompressed tensors
  too, i.e. each rank's bias gradient minus the mean. Those errors add up to zero over the ranks, so
  they leave the next mean unchanged; the authors' library zeroes them (its ``AllReduce.aggregate``).
* Our division: ``all_reduce_mean`` divides by W before each of the three all-reduces; torch sums
  and divides after (not at all for P, which is orthogonalised anyway). With W a power of two the two
  are the same bits; otherwise they differ by rounding.

Buckets: the course's own (``replica.buckets.build_buckets``, as ``compressed.py`` uses), because DDP
also calls the hook once per bucket, and each bucket keeps its own Q and error. Each compressing bucket
costs three all-reduces (uncompressed part, P, Q), so PowerSGD pays three latencies where plain
all-reduce pays one; it wins where bandwidth, not latency, sets the price (a slow link, a big model).
"""
from __future__ import annotations

import numpy as np
import torch

from .. import validate
from ..replica.buckets import build_buckets
from .base import GradientSync
from .knobs import Knob

MIN_COMPRESSION_RATE = 2  # PowerSGDState's default: compress only where it sends under half the numbers


def worth_compressing(n: int, m: int, rank: int) -> bool:
    """torch's ``_should_compress``: the sketch, (n + m) r numbers, is at least 2x smaller than n m."""
    return (n + m) * rank * MIN_COMPRESSION_RATE < n * m


def orthogonalise(matrix: torch.Tensor) -> None:
    """Make the columns of ``matrix`` (n x r) orthonormal in place, as torch's ``_orthogonalize`` does."""
    r = matrix.shape[1]
    if r > 2:  # torch: Householder QR, faster than Gram-Schmidt above rank 2 (not for 16-bit floats)
        matrix.copy_(torch.linalg.qr(matrix).Q)
        return
    for i in range(r):  # Gram-Schmidt: normalise column i, then remove it from the columns after it
        col = matrix[:, i:i + 1]
        col /= torch.norm(col, dim=0, keepdim=True)  # epsilon 0, as torch: an all-zero column gives NaN
        if i + 1 < r:
            rest = matrix[:, i + 1:]
            rest -= torch.sum(col * rest, dim=0, keepdim=True) * col


def refuse_fp16(config) -> None:
    """What PowerSGD (ours and torch's hook alike) refuses besides its knobs, before any rank starts."""
    if config.precision == "fp16":  # a step the loss scaler skips has inf gradients: they would stay in Q
        raise validate.refusal("precision", config.precision, f"strategy={config.strategy!r} keeps Q and the error "
                               "from step to step, so one overflowing fp16 step would poison every later one; "
                               "use 'bf16' or 'fp32'")


RANK = Knob("powersgd_rank", 4, "PowerSGD's rank r: columns of P and Q", low=1)
START = Knob("powersgd_start", 10, "the step PowerSGD starts compressing at; plain all-reduces before", low=1)
ERROR_FEEDBACK = Knob("powersgd_error_feedback", True, "add what the sketch left out to the next gradient",
                      kind=bool)


def flat_matrices(shapes, like: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One flat buffer (one all-reduce for all of them) and a matrix view into it per shape."""
    flat = like.new_empty(sum(n * r for n, r in shapes))
    views, at = [], 0
    for n, r in shapes:
        views.append(flat[at:at + n * r].view(n, r))
        at += n * r
    return flat, views


class PowerSGD(GradientSync):
    name = "powersgd"
    exact = False
    label = "PowerSGD (low rank)"
    colour = "#64B5CD"
    knobs = (RANK, START, ERROR_FEEDBACK)
    main_knob = "powersgd_rank"

    @classmethod
    def steady_from(cls, config: dict) -> int:
        # the plain all-reduces before it are a warm-up, not what PowerSGD sends
        return cls.settings(config["knobs"])["powersgd_start"]

    @classmethod
    def check(cls, config, world_size: int) -> None:
        super().check(config, world_size)
        refuse_fp16(config)

    def __init__(self, model, timeline, powersgd_rank: int, powersgd_start: int, powersgd_error_feedback: bool,
                 bucket_mb=1.0, first_bucket_mb=None, seed: int = 0, **options):
        super().__init__(model, timeline, **options)
        self.low_rank, self.start = powersgd_rank, powersgd_start  # low_rank: self.rank is this process's
        self.error_feedback = powersgd_error_feedback
        self.buckets = build_buckets(model, bucket_mb, first_bucket_mb)
        self.rng = np.random.RandomState(seed)  # PowerSGDState.rng: a fresh seed per new Q, equal on every rank
        self.errors = {}  # bucket index -> what the sketch left out last step (error feedback)
        self.q_memory = {}  # bucket index -> (flat Q of its matrices, views): next step's warm start

    def finish(self, step: int) -> None:
        for bucket in self.buckets:
            with self.overhead(step, "pack"):
                bucket.copy_in()
            if step < self.start:  # torch's "vanilla allreduce" phase
                with self.comm.exchange(bucket=bucket.index):
                    self.all_reduce_mean(bucket.buffer)
            else:
                self._low_rank_mean(step, bucket)
            with self.overhead(step, "unpack"):
                bucket.copy_out()

    def _low_rank_mean(self, step: int, bucket) -> None:
        """Replace ``bucket.buffer`` by the mean gradient: sketched matrices, the rest exactly."""
        grad, index = bucket.buffer, bucket.index
        with self.overhead(step, "compress"):
            if self.error_feedback:
                if index in self.errors:
                    grad += self.errors[index]
                before = grad.clone()
            matrices, whole = [], []
            for view in bucket.views:
                matrix = view.view(view.shape[0] if view.dim() else 1, -1)
                n, m = matrix.shape
                (matrices if worth_compressing(n, m, min(n, m, self.low_rank)) else whole).append(matrix)
            shapes = list(dict.fromkeys(mat.shape for mat in matrices))  # torch's grouping by shape, in order
            matrices.sort(key=lambda mat: shapes.index(mat.shape))
            ranks = [min(*mat.shape, self.low_rank) for mat in matrices]
            if index not in self.q_memory:  # the first compressing step: Q drawn from the shared seed
                self.q_memory[index] = flat_matrices([(mat.shape[1], r) for mat, r in zip(matrices, ranks)], grad)
                generator = torch.Generator().manual_seed(int(self.rng.randint(1_000_000_000)))
                for q in self.q_memory[index][1]:
                    q.copy_(torch.randn(q.shape, generator=generator, dtype=q.dtype))
            q_flat, qs = self.q_memory[index]
            for q in qs:
                orthogonalise(q)  # torch orthogonalises the warm Q as well as a fresh one
            p_flat, ps = flat_matrices([(mat.shape[0], r) for mat, r in zip(matrices, ranks)], grad)
            for mat, q, p in zip(matrices, qs, ps):
                torch.matmul(mat, q, out=p)
            plain = torch.cat([t.reshape(-1) for t in whole]) if whole else grad.new_empty(0)
        with self.comm.exchange(bucket=index):
            if plain.numel():
                self.all_reduce_mean(plain)
            if matrices:
                self.all_reduce_mean(p_flat)
        with self.overhead(step, "compress"):
            for p in ps:
                orthogonalise(p)
            for mat, p, q in zip(matrices, ps, qs):
                torch.matmul(mat.T, p, out=q)
        if matrices:
            with self.comm.exchange(bucket=index):
                self.all_reduce_mean(q_flat)  # kept in q_memory: the warm start of the next step
        with self.overhead(step, "decompress"):
            at = 0
            for t in whole:
                t.copy_(plain[at:at + t.numel()].view_as(t))
                at += t.numel()
            for mat, p, q in zip(matrices, ps, qs):
                torch.matmul(p, q.T, out=mat)  # the mean gradient's sketch, written into the bucket
            if self.error_feedback:
                self.errors[index] = before - grad
