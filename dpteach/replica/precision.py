"""Mixed precision on one rank: a 16-bit forward pass, a dynamic loss scale for fp16, clipping.

What changes and what does not (PyTorch's automatic mixed precision, ``torch.amp``)::

    parameters, gradients, optimizer state   fp32, as without autocast: the "master" copy
    forward under torch.autocast(dtype)      matmuls and convolutions run on 16-bit copies of their
                                             inputs and weights; the ops on the device's fp32 list
                                             run in fp32 - on CUDA losses, softmax, layer norm, sums;
                                             on CPU the losses, while softmax and layer norm stay
                                             16-bit (torch.amp's "Autocast Op Reference")
    saved for backward                       those 16-bit copies (half the bytes of fp32)
    backward                                 the same ops in the same precisions, in reverse; each
                                             16-bit weight copy's gradient is cast back to fp32

Why keep fp32 copies at all (Micikevicius et al., "Mixed Precision Training", ICLR 2018, section
3.1): an update ``lr * grad`` is often smaller than the spacing of 16-bit numbers near the weight,
so added to a 16-bit weight it would round away; summed into an fp32 weight it is kept.

**bf16** has float32's 8-bit exponent (the same range, about 1e-38 to 3e38) and 8 significant bits:
gradients neither overflow nor underflow where fp32 would not, so it needs no loss scale.
**fp16** has a 5-bit exponent: above 65504 it overflows to inf, and its smallest number is 2^-24
(about 6e-8): values up to half of that, 2^-25, round to zero (those just above round up to 2^-24),
and many activation gradients live down there. The remedy (Micikevicius et al.,
section 3.2) multiplies the loss by a large scale ``S`` before backward, so every gradient is
``S`` times larger on its way through the fp16 ops, and divides the fp32 gradients by ``S``
before the optimizer uses them. If ``S`` is too large something overflows: the step is skipped.

:class:`LossScaler` is that rule written out as ``torch.amp.GradScaler`` applies it (its
``unscale_`` and ``update``, and ``_amp_update_scale_cpu_`` of FSDP's ``ShardedGradScaler``
spells the same rule in Python): start at ``init_scale``; on a step with an inf or NaN gradient
skip the optimizer step and multiply ``S`` by ``backoff_factor``; after ``growth_interval`` clean
steps in a row multiply it by ``growth_factor``. The tests train with both and expect the same
scales, the same skipped steps and the same weights.

Two things data parallelism adds. Every rank must make the same decision, or the replicas part:
with replicated gradients (DDP) every rank sees the same averaged gradients and so the same inf,
without a message; when each rank holds a different shard of the gradients, the flags must be
combined with an all-reduce: FSDP1's ``ShardedGradScaler.unscale_`` does it by hand, and under FSDP2
the plain ``GradScaler`` gets it from DTensor, whose dispatcher reduces the found-inf flag of
``_amp_foreach_non_finite_check_and_unscale_`` across the mesh (``found_inf_reduce_handler`` in
``torch/distributed/tensor/_dispatch.py``). This course keeps loss scaling and clipping to the
replicated strategies. And the gradients must be unscaled *before*
clipping: ``clip_grad_norm_`` on scaled gradients sees a norm ``S`` times too large.
"""
from __future__ import annotations

import contextlib

import torch

from ..ranks import context

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class LossScaler:
    """Dynamic loss scaling with ``torch.amp.GradScaler``'s rule and defaults."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000):
        self.scale = torch.tensor(float(init_scale), dtype=torch.float32)  # float32, as GradScaler keeps it
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self.clean_steps = 0  # GradScaler's "growth tracker"

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale.to(loss.device)

    def unscale(self, grads: list) -> bool:
        """Divide every gradient by the scale, in place; True if any of them holds an inf or a NaN.
        (GradScaler multiplies by a reciprocal taken in float64 and rounded to float32; so do we.)"""
        inverse = self.scale.double().reciprocal().float()
        found_inf = False
        for g in grads:
            found_inf |= not bool(torch.isfinite(g).all())
            g.mul_(inverse.to(g.device))
        return found_inf

    def update(self, found_inf: bool) -> None:
        if found_inf:
            self.scale *= self.backoff_factor
            self.clean_steps = 0
        else:
            self.clean_steps += 1
            if self.clean_steps == self.growth_interval:
                self.scale *= self.growth_factor
                self.clean_steps = 0


class Precision:
    """The precision choices of one training run, applied by the trainer around forward, backward and step.

    ``precision``: "fp32", "bf16" or "fp16" (the forward pass under ``torch.autocast``; fp16 with a
    :class:`LossScaler`). ``clip_norm``: clip the total gradient norm to this, or None.
    ``unscale_before_clip=False`` reproduces a classic mistake on purpose (clipping scaled gradients).
    Per step it records the scale, whether the step was skipped, and the gradient norm clipping saw.
    """

    def __init__(self, precision: str = "fp32", clip_norm: float | None = None, init_scale: float = 2.0**16,
                 growth_interval: int = 2000, unscale_before_clip: bool = True):
        self.dtype = PRECISIONS[precision]
        self.name, self.clip_norm, self.unscale_before_clip = precision, clip_norm, unscale_before_clip
        self.scaler = LossScaler(init_scale, growth_interval=growth_interval) if precision == "fp16" else None
        self.scales, self.skipped, self.grad_norms = [], [], []

    @property
    def active(self) -> bool:
        """False for plain fp32 without clipping: then the trainer steps exactly as it always has."""
        return self.name != "fp32" or self.clip_norm is not None

    def autocast(self, device_type: str | None = None):
        """The forward pass's autocast on ``device_type`` (default: this rank's device)."""
        if self.dtype is torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type or context.device().type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale_loss(loss) if self.scaler else loss).backward()

    def step(self, strategy, optimizer) -> None:
        """Unscale, clip, then step through the strategy - or skip the step if a gradient overflowed."""
        if not self.active:
            return strategy.step_optimizer(optimizer)
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        clip_while_scaled = self.scaler is not None and not self.unscale_before_clip
        if clip_while_scaled:
            self._clip(grads)  # the mistake: the norm is S times too large, so clipping cuts too much
        found_inf = False
        if self.scaler:
            self.scales.append(self.scaler.scale.item())
            found_inf = self.scaler.unscale(grads)
        if not clip_while_scaled:
            self._clip(grads)
        self.skipped.append(found_inf)
        if found_inf:  # every rank holds the same averaged gradients, so every rank skips together
            optimizer.zero_grad()
        else:
            strategy.step_optimizer(optimizer)
        if self.scaler:
            self.scaler.update(found_inf)

    def _clip(self, grads: list) -> None:
        norm = torch.nn.utils.get_total_norm(grads).item() if grads else 0.0  # what clip_grad_norm_ compares
        self.grad_norms.append(norm)
        if self.clip_norm is not None and norm > self.clip_norm and all(torch.isfinite(g).all() for g in grads):
            for g in grads:
                g.mul_(self.clip_norm / (norm + 1e-6))  # clip_grad_norm_'s rule: limit / (norm + 1e-6)

    def report(self) -> dict | None:
        if not self.active:
            return None
        return {"precision": self.name, "scales": self.scales, "skipped": self.skipped, "grad_norms": self.grad_norms}


def saved_for_backward(model: torch.nn.Module, loss_of, precision: str = "fp32") -> dict:
    """Bytes that one forward pass saves for backward under ``precision``, measured from the saved tensors.

    ``loss_of(model)`` runs the forward pass and returns the loss. Split into the 16-bit copies of the
    weights that autocast made (a cast whose input is a parameter) and everything else (activations).
    A parameter saved as itself is not counted: it exists anyway. Each storage counts once.
    """
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {"activations": {}, "weight_copies": {}}

    def is_weight_copy(t):
        fn = (t._base if t._base is not None else t).grad_fn  # a matmul saves a view (the transpose) of the copy
        return fn is not None and type(fn).__name__ == "ToCopyBackward0" and any(
            nxt is not None and type(nxt).__name__ == "AccumulateGrad" for nxt, _ in fn.next_functions)

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen["weight_copies" if is_weight_copy(t) else "activations"][storage.data_ptr()] = storage.nbytes()
        return t

    device_type = next(model.parameters()).device.type
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), Precision(precision).autocast(device_type):
        loss = loss_of(model)
    del loss
    return {kind: sum(found.values()) for kind, found in seen.items()}
