"""How big a batch: the learning-rate rules, the gradient noise scale, and the steps a batch size costs.

Data parallelism multiplies the global batch by W. Whether that saves steps depends on how noisy one
sample's gradient is compared with the gradient itself, and the learning rate has to follow the batch.

**Learning-rate rules.** With a base learning rate ``lr0`` that trains well at a base batch ``B0``, a
batch ``B = k B0`` gets

* ``fixed``: ``lr0`` - the same step, k times the samples behind it;
* ``linear``: ``k lr0`` (Goyal et al. 2017, "Accurate, Large Minibatch SGD", section 2.1). Their argument:
  k small-batch steps move the weights by about ``lr0`` times the sum of k gradients, one large step by
  ``lr`` times their mean, so ``lr = k lr0`` matches them *if the gradient hardly changes over those k
  steps*. It fails early in training, when it changes fast, which is why they add a
  **gradual warmup** (their section 2.2): start at ``lr0`` and ramp linearly to ``k lr0`` (over 5 epochs in
  their ImageNet runs); and it fails at very large k (beyond about 8k images for ResNet-50 on ImageNet, their
  figure 1);
* ``sqrt``: ``sqrt(k) lr0``, which keeps the variance of the update the same (discussed by Krizhevsky 2014,
  "One weird trick for parallelizing convolutional neural networks"); it is the rule derived for Adam and
  RMSprop by Malladi et al. 2022 ("On the SDEs and Scaling Rules for Adaptive Gradient Algorithms").

Here warmup ramps linearly from ``lr0`` to the scaled rate over ``warmup_steps`` optimizer steps.

**The noise scale** (McCandlish et al. 2018, "An Empirical Model of Large-Batch Training"). If G is the
true gradient and Sigma the covariance of one sample's gradient, the simple noise scale is
``B_simple = tr(Sigma) / |G|^2``: the batch at which the noise in a batch gradient is as large as the
gradient. Neither quantity is known, but the expected squared norm of a gradient averaged over B
samples is ``|G|^2 + tr(Sigma) / B``, so the norms at two batch sizes give both (their appendix A.1)::

    |G|^2    ~ (B_big |g_big|^2 - B_small |g_small|^2) / (B_big - B_small)
    tr(Sigma) ~ (|g_small|^2 - |g_big|^2) / (1 / B_small - 1 / B_big)

Data-parallel ranks hand over both for free: a rank's own gradient averages ``B / W`` samples, the
all-reduced one averages B. Each estimate is noisy, so the paper averages the two over many steps
*before* dividing, which :class:`NoiseScale` does.

**Steps and samples to a target.** For the steps S and samples E to reach a given loss the paper derives
(and measures, on tasks from MNIST to Dota) ``S = S_min (1 + B_noise / B)`` and ``E = E_min (1 + B / B_noise)``
with ``E_min = S_min B_noise``: far below ``B_noise`` doubling the batch halves the steps for free; far
above, it saves no steps and doubles the samples. Their critical batch ``B_crit = E_min / S_min`` is
where both cost twice their minimum. :func:`fit_steps` fits the first relation, which is linear in
``1 / B``, by least squares.
"""
from __future__ import annotations

import math

from .. import validate

LR_RULES = ("fixed", "linear", "sqrt")


def scaled_lr(rule: str, base_lr: float, base_batch: int, batch: int) -> float:
    """The learning rate for a global ``batch`` under ``rule``, from ``base_lr`` at ``base_batch``."""
    validate.choice("rule", rule, LR_RULES)
    validate.number("base_lr", base_lr, above=0)
    validate.integer("base_batch", base_batch, low=1)
    validate.integer("batch", batch, low=1)
    k = batch / base_batch
    return base_lr * {"fixed": 1.0, "linear": k, "sqrt": math.sqrt(k)}[rule]


def lr_at(step: int, target_lr: float, base_lr: float, warmup_steps: int) -> float:
    """The rate for optimizer step ``step`` (0-based): a linear ramp from ``base_lr`` to ``target_lr`` over
    the first ``warmup_steps`` steps (Goyal et al.'s gradual warmup), then ``target_lr``."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return target_lr
    return base_lr + (target_lr - base_lr) * step / warmup_steps


def run_outcome(run: dict) -> str:
    """How a run to a target ended, in words: its steps, where it diverged, or where it was stopped."""
    if run["steps_to_target"] is not None:
        return f"{run['steps_to_target']} steps"
    if run.get("diverged_at") is not None:
        return f"diverged at step {run['diverged_at']}"
    return f"not in {run['stopped_at']} steps"


def noise_scale_terms(small_sq: float, big_sq: float, b_small: float, b_big: float) -> tuple[float, float]:
    """Unbiased estimates of ``|G|^2`` and ``tr(Sigma)`` from the squared norms of two gradients that
    average ``b_small`` and ``b_big`` samples (McCandlish et al. 2018, appendix A.1)."""
    if not b_big > b_small > 0:
        raise ValueError(f"b_small={b_small!r}, b_big={b_big!r} are not allowed: need 0 < b_small < b_big")
    g2 = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
    trace = (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big)
    return g2, trace


class NoiseScale:
    """Running means of the two estimates over steps; :attr:`value` is their ratio, B_simple."""

    def __init__(self):
        self.g2 = self.trace = 0.0
        self.steps = 0

    def add(self, small_sq: float, big_sq: float, b_small: float, b_big: float) -> None:
        g2, trace = noise_scale_terms(small_sq, big_sq, b_small, b_big)
        self.g2 += g2
        self.trace += trace
        self.steps += 1

    @property
    def value(self) -> float | None:
        """``tr(Sigma) / |G|^2`` from the means so far; None before a step, or if ``|G|^2`` came out <= 0."""
        if not self.steps or self.g2 <= 0:
            return None
        return self.trace / self.g2

    @classmethod
    def pooled(cls, parts) -> "NoiseScale":
        """One estimate from several runs' :meth:`as_dict` summaries, every step weighing the same."""
        total = cls()
        for part in parts:
            total.g2 += part["grad_sq"] * part["steps"]
            total.trace += part["trace_sigma"] * part["steps"]
            total.steps += part["steps"]
        return total

    def as_dict(self) -> dict:
        n = max(self.steps, 1)
        return {"b_simple": self.value, "grad_sq": self.g2 / n, "trace_sigma": self.trace / n, "steps": self.steps}


def fit_steps(batches, steps) -> dict:
    """Least-squares fit of ``S = S_min (1 + B_noise / B)`` to measured (batch, steps) pairs.

    ``S`` is linear in ``x = 1 / B``: ``S = a + b x`` with ``S_min = a`` and ``B_noise = b / a``. Returns
    ``{"s_min", "b_noise", "e_min" (= s_min b_noise), "predicted": [steps per batch], "worst_error"
    (the largest |predicted - measured| / measured)}``; at least two distinct batches are needed.
    """
    pairs = [(float(b), float(s)) for b, s in zip(batches, steps) if s is not None]
    if len({b for b, _ in pairs}) < 2:
        raise ValueError(f"batches={list(batches)!r} with steps={list(steps)!r} is not allowed: the fit needs "
                         "steps measured at two or more different batches")
    xs = [1.0 / b for b, _ in pairs]
    ys = [s for _, s in pairs]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    s_min = my - slope * mx
    b_noise = slope / s_min if s_min > 0 else None
    predicted = [s_min + slope / b for b, _ in pairs]
    return {"s_min": s_min, "b_noise": b_noise, "e_min": s_min * b_noise if b_noise is not None else None,
            "batches": [int(b) for b, _ in pairs], "measured": ys, "predicted": predicted,
            "worst_error": max(abs(p - y) / y for p, y in zip(predicted, ys))}
