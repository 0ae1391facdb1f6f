"""Predict how long an all-reduce takes, with the alpha-beta(-gamma) cost model.

Every message a rank sends costs a fixed start-up time plus a time that grows with its size, and
every byte it combines (adds) costs a little compute. A link (``dpteach.network.Link``) holds the three
numbers: ``alpha`` (its ``alpha_s``, the latency of one message), ``beta`` (``beta_s_per_byte``, 1 /
bandwidth) and ``gamma`` (``gamma_s_per_byte``, the time to reduce a byte; often small next to beta, so
0 by default);

an algorithm that sends ``k`` messages one after another, moving ``m`` bytes and reducing ``r``
bytes on its critical path, takes ``k*alpha + m*beta + r*gamma``. Each all-reduce below differs
only in those three counts, which is why small messages favour algorithms with few steps (latency
dominates) and large ones favour algorithms that move few bytes per rank (bandwidth dominates).

The formulas follow R. Thakur, R. Rabenseifner and W. Gropp, "Optimization of Collective
Communication Operations in MPICH" (IJHPCA, 2005), and P. Patarasuk and X. Yuan, "Bandwidth
optimal all-reduce algorithms for clusters of workstations" (JPDC, 2009), which shows that the ring
moves the least data any all-reduce can move per rank, 2(p-1)/p * n bytes.

NCCL makes the same kind of trade-off at run time: its tuning model (``src/graph/tuning.cc``)
prices every (algorithm, protocol) pair as latency + bytes / bandwidth, with figures it derived from
the topology it detected, and ``src/enqueue.cc`` runs the cheapest for the message at hand. NCCL's
algorithms are not these textbook ones, though: its tree is a chain inside each node and a double
binary tree across nodes, pipelined in chunks, and it also has CollNet and NVLS where the hardware
allows. :func:`choose_algorithm` applies the idea to this module's ring and binomial tree. (gloo,
which the course uses on CPU, does not choose: its all-reduce is a ring at every size.)

Functions take ``n`` in bytes, ``p`` ranks and a ``Link``, and return seconds.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .. import validate
from .link import Link

ALGORITHMS = ("ring", "tree", "naive", "halving_doubling")
ALGORITHMS_FOR_CHOICE = ("ring", "tree")


def _check_real(name, value, *, positive=False):
    if positive:
        return validate.number(name, value, above=0, unit="a finite number")
    return validate.number(name, value, low=0, unit="a finite number")


def _check_n(n, name="n"):
    """Message size in bytes: a whole number >= 0 (``1e6`` is accepted, ``0.5`` is not)."""
    n = validate.number(name, n, low=0, unit="a whole number of bytes")
    if n != math.floor(n):
        validate.integer(name, n, low=0, why=" (a whole number of bytes)")
    return n


def _check_p(p, name="p"):
    return validate.integer(name, p, low=1, why=" (a number of ranks)")


def _check_algorithm(algorithm, name="algorithm"):
    return validate.choice(name, algorithm, ALGORITHMS)


def _check_link(link):
    if not isinstance(link, Link):
        raise validate.refusal("link", link, "it must be a dpteach.network.Link (a preset of dpteach.network.PRESETS, "
                               "Link.from_bandwidth, or resolve_link of a fit)")
    return link


def _coefficients(algorithm, n, p):
    """(messages, bytes sent, bytes reduced) on the critical path: time = A*alpha + B*beta + C*gamma."""
    if p == 1:
        return 0.0, 0.0, 0.0
    if algorithm == "ring":
        return 2.0 * (p - 1), 2.0 * (p - 1) / p * n, (p - 1) / p * n
    if algorithm == "tree":
        steps = math.ceil(math.log2(p))
        return 2.0 * steps, 2.0 * steps * n, steps * n
    if algorithm == "naive":
        return 2.0 * (p - 1), 2.0 * (p - 1) * n, (p - 1) * n
    # halving_doubling: run on the largest power of two q <= p; the p - q extra ranks first hand
    # their whole vector to a partner (one message, n bytes, n reduced) and get the result back at
    # the end (one more message, n bytes).
    q = 1 << (p.bit_length() - 1)
    a, b, c = 2.0 * math.log2(q), 2.0 * (q - 1) / q * n, (q - 1) / q * n
    if q != p:
        a, b, c = a + 2.0, b + 2.0 * n, c + n
    return a, b, c


def _time(algorithm, n, p, link):
    n, p, link = _check_n(n), _check_p(p), _check_link(link)
    a, b, c = _coefficients(algorithm, n, p)
    return a * link.alpha_s + b * link.beta_s_per_byte + c * link.gamma_s_per_byte


def ring_allreduce_time(n, p, link):
    """Ring: a reduce-scatter then an all-gather, each p-1 steps that pass n/p bytes to a neighbour.

    ``T = 2(p-1)*alpha + 2(p-1)/p * n*beta + (p-1)/p * n*gamma``
    """
    return _time("ring", n, p, link)


def tree_allreduce_time(n, p, link):
    """Binomial tree: reduce to a root, then broadcast back, sending the whole message each step.

    ``T = 2*ceil(log2 p)*(alpha + n*beta) + ceil(log2 p)*n*gamma``. (NCCL's tree is a pipelined
    double binary tree across nodes, each tree carrying half the data, and costs far less per byte;
    this is the plain textbook version.)
    """
    return _time("tree", n, p, link)


def naive_allreduce_time(n, p, link):
    """Naive: a root receives p-1 whole messages one after another, reduces, sends p-1 copies back.

    ``T = 2(p-1)*(alpha + n*beta) + (p-1)*n*gamma``
    """
    return _time("naive", n, p, link)


def halving_doubling_allreduce_time(n, p, link):
    """Rabenseifner: reduce-scatter by recursive halving, then all-gather by recursive doubling.

    For p a power of two: ``T = 2*log2(p)*alpha + 2(p-1)/p * n*beta + (p-1)/p * n*gamma``.
    Otherwise, with q the largest power of two below p, the p-q extra ranks first send their
    vector to a partner and receive the result at the end (as in Thakur et al.), adding
    ``2*alpha + 2*n*beta + n*gamma``: ``T = 2*(log2(q)+1)*alpha + (2(q-1)/q + 2)*n*beta +
    ((q-1)/q + 1)*n*gamma``.
    """
    return _time("halving_doubling", n, p, link)


def predict(algorithm, n, p, link):
    """Predicted all-reduce time in seconds of ``algorithm`` (one of ``ALGORITHMS``) on ``link``."""
    return _time(_check_algorithm(algorithm), n, p, link)


RING_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


def collective_time(kind, nbytes, p, link, algorithm="ring"):
    """Seconds collective ``kind`` on ``nbytes`` (in all) takes on ``link``: the ring version, or for an
    all-reduce the ``algorithm`` that ran. All-gather, reduce-scatter and all-to-all are each one half of a
    ring all-reduce: ``(p-1)*alpha + (p-1)/p * n*beta`` (Thakur, Rabenseifner & Gropp 2005)."""
    validate.choice("kind", kind, RING_COLLECTIVES)
    if _check_p(p) < 2:
        return 0.0
    if kind == "all_reduce":
        return predict(algorithm, nbytes, p, link)
    n, link = _check_n(nbytes, "nbytes"), _check_link(link)
    return (p - 1) * link.alpha_s + (p - 1) / p * n * link.beta_s_per_byte


@dataclass
class Fit:
    """Result of :func:`fit_alpha_beta`: the fitted link, R², measured - predicted per sample."""

    link: Link
    r2: float
    residuals: list = field(default_factory=list)
    algorithm: str = "ring"

    def as_dict(self) -> dict:
        """The fit in a report (JSON); ``dpteach.network.resolve_link`` reads the link back from it."""
        return {"algorithm": self.algorithm, "alpha_s": self.link.alpha_s, "beta_s_per_byte": self.link.beta_s_per_byte,
                "bandwidth_GBps": self.link.bandwidth_GBps, "r2": self.r2}


def fit_alpha_beta(samples, algorithm="ring"):
    """Fit alpha and beta to measured all-reduce times by (non-negative) least squares.

    ``samples``: iterable of ``(n_bytes, p, seconds)``. Each sample gives one equation
    ``seconds = A(p)*alpha + B(n, p)*beta`` with A, B the algorithm's message and byte counts.
    gamma cannot be told apart from beta here (every algorithm in this module reduces exactly half
    the bytes it sends), so it is folded in: the fitted beta estimates ``beta + gamma/2`` and the
    returned gamma is 0. Negative estimates are not physical; if one appears, that coefficient is
    fixed at 0 and the other refitted. ``r2`` is nan when all times are equal (R² undefined).
    """
    _check_algorithm(algorithm)
    try:
        samples = list(samples)
    except TypeError:
        raise validate.refusal("samples", samples, "it must be an iterable of (n_bytes, p, seconds)") from None
    rows, times = [], []
    for i, s in enumerate(samples):
        if not isinstance(s, (tuple, list)) or len(s) != 3:
            raise validate.refusal(f"samples[{i}]", s, "each sample must be a tuple (n_bytes, p, seconds)")
        n, p = _check_n(s[0], f"samples[{i}] n_bytes"), _check_p(s[1], f"samples[{i}] p")
        times.append(_check_real(f"samples[{i}] seconds", s[2]))
        rows.append(_coefficients(algorithm, n, p)[:2])
    X, t = np.array(rows, dtype=float).reshape(-1, 2), np.array(times)
    scale = np.abs(X).max(axis=0)
    if len(rows) < 2 or np.any(scale == 0) or np.linalg.matrix_rank(X / scale) < 2:
        raise validate.refusal("samples", samples if len(samples) <= 3 else f"<{len(samples)} samples>",
                   "alpha and beta are two unknowns, so at least two samples with p >= 2 whose "
                   "(latency, bandwidth) coefficients are not proportional are needed, e.g. two "
                   "different message sizes at the same p")
    Xs = X / scale
    coef = np.linalg.lstsq(Xs, t, rcond=None)[0]
    if np.any(coef < 0):  # the optimum lies on a boundary: try each coefficient alone
        candidates = [np.zeros(2)]
        for j in (0, 1):
            c = np.zeros(2)
            c[j] = max(0.0, float(Xs[:, j] @ t) / float(Xs[:, j] @ Xs[:, j]))
            candidates.append(c)
        coef = min(candidates, key=lambda c: float(np.sum((t - Xs @ c) ** 2)))
    alpha, beta = (float(v) for v in coef / scale)
    residuals = t - X @ np.array([alpha, beta])
    ss_tot = float(np.sum((t - t.mean()) ** 2))
    r2 = 1.0 - float(residuals @ residuals) / ss_tot if ss_tot > 0 else math.nan
    return Fit(Link(f"{algorithm} fit", max(alpha, 0.0), max(beta, 0.0), source="fitted"), r2, [float(r) for r in residuals], algorithm)


def crossover_bytes(p, link, a="tree", b="ring"):
    """The message size in bytes below which ``a`` is faster than ``b`` (above it, ``b`` is).

    Both predictions are straight lines in n, ``T_x(n) = L_x + n*S_x``, so the crossing is
    ``n* = (L_b - L_a) / (S_a - S_b)``. Returns ``None`` when no such positive, finite size
    exists: when one algorithm is never slower at any n (the limits "a wins up to infinity" and
    "a wins below 0 bytes" are reported as None rather than ``math.inf`` or ``0``; compare
    :func:`predict` at any size to see which wins), and when ``a`` wins only for *large*
    messages (call again with ``a`` and ``b`` swapped to get that size).
    Example: tree beats ring below n* for p >= 4 and beta > 0; at p = 2 and 3 the tree has no
    fewer steps than the ring, so ring always wins and the answer is None.
    """
    p, link = _check_p(p), _check_link(link)
    _check_algorithm(a, "a"), _check_algorithm(b, "b")
    la, ba, ca = _coefficients(a, 1.0, p)
    lb, bb, cb = _coefficients(b, 1.0, p)
    d_latency = (la - lb) * link.alpha_s                                             # T_a(0) - T_b(0)
    d_slope = (ba - bb) * link.beta_s_per_byte + (ca - cb) * link.gamma_s_per_byte   # d/dn [T_a - T_b]
    if d_latency < 0 < d_slope:
        return -d_latency / d_slope
    return None


@dataclass
class Choice:
    """Result of :func:`choose_algorithm`: the fastest candidate and every candidate's time."""

    algorithm: str
    times: dict = field(default_factory=dict)


def choose_algorithm(n, p, link, candidates=ALGORITHMS_FOR_CHOICE):
    """Predict each candidate's time and pick the least (ties go to the earlier candidate).

    ``halving_doubling`` is considered only when p is a power of two, the case it is built for.
    """
    n, p, link = _check_n(n), _check_p(p), _check_link(link)
    if isinstance(candidates, str):
        candidates = (candidates,)
    try:
        candidates = tuple(candidates)
    except TypeError:
        raise validate.refusal("candidates", candidates, f"it must be a sequence of names from {ALGORITHMS}") from None
    for c in candidates:
        _check_algorithm(c, "candidates")
    usable = [c for c in candidates if c != "halving_doubling" or p & (p - 1) == 0]
    if not usable:
        raise validate.refusal("candidates", candidates, "it must name at least one algorithm usable at this p "
                   f"(p={p}; halving_doubling needs a power of two) from {', '.join(ALGORITHMS)}")
    times = {c: predict(c, n, p, link) for c in usable}
    best = usable[0]
    for c in usable[1:]:
        if times[c] < times[best]:
            best = c
    return Choice(best, times)


def busbw_factor(p):
    """2(p-1)/p: turns an all-reduce's algorithm bandwidth into bus bandwidth, the per-link rate
    comparable to hardware peak (nccl-tests, doc/PERFORMANCE.md). 0 for p = 1."""
    p = _check_p(p)
    return 2.0 * (p - 1) / p


def algbw(n, seconds):
    """Algorithm bandwidth n / seconds in bytes per second (divide by 1e9 for nccl-tests' GB/s)."""
    return _check_n(n) / _check_real("seconds", seconds, positive=True)
