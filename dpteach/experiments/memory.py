"""Lesson 01 (second half): what one replica must hold, and what sharding it with ZeRO changes.

Plain data parallelism copies *everything* to every rank: parameters, gradients and optimizer
state. Adding ranks makes each step see more data, but it never lowers the memory one rank needs;
a model that does not fit on one GPU does not fit on a thousand of them either.

Per parameter, the ZeRO paper (Rajbhandari et al., SC 2020, section 3.1) counts 16 bytes for mixed
precision with Adam - 2 for the fp16 weights, 2 for their gradients, 12 for the fp32 master weights and
two moments - and 16 for fp32 with Adam as well (4 + 4 + 8); the whole table, and what each ZeRO stage
shards of it, is in ``dpteach/replica/model_states.py``.

"mixed" is the recipe the ZeRO paper counts (Micikevicius et al. 2018): fp16 weights and gradients
for the arithmetic, and an fp32 master copy of the weights beside the optimizer's fp32 state. Other
recipes split the same 16 bytes of Adam differently: PyTorch's autocast keeps fp32 parameters and
gradients (4 + 4) and runs only the operations in fp16/bf16, so its optimizer holds 8. ZeRO
shards these over the W data-parallel ranks: stage 1 the optimizer state, stage 2 also the
gradients, stage 3 also the parameters; a sharded part costs 1/W of its bytes per rank.

Traffic (the paper's section 7): plain data parallelism all-reduces the gradients, a reduce-scatter
plus an all-gather of Psi elements each, 2 Psi per step. Stages 1 and 2 move exactly that - a
reduce-scatter of the gradients, an all-gather of the updated parameters - so their memory saving
costs no extra bytes. Stage 3 must also all-gather the parameters before forward and again before
backward: 3 Psi, 1.5x. Each rank sends (W-1)/W of each volume with a ring, in the gradients' dtype.
Activations, temporary buffers and fragmentation come on top and are left out here: they depend
on the batch and the model's shape, not on the parameter count.

``memory_per_replica`` is that table as arithmetic. ``measure_model_memory`` checks it against
reality: it builds the course's models, runs one optimizer step, and counts the bytes of the actual
parameter, gradient and optimizer-state tensors.
"""
from __future__ import annotations

import torch

from .. import validate
from ..ranks.backend import plain_fp32, visible_gpus
from ..replica.data import loss_fn, make_dataset, sample_batch
from ..replica.model_states import BYTES_PER_PARAM, OPTIMIZERS, model_state_bytes
from ..replica.models import SPECS, build_model, model_names


def memory_per_replica(params_billion: float = 7.0, optimizer: str = "adam", precision: str = "mixed",
                       world_size: int = 8, zero_stage: int = 0, gpu_gb: float = 80.0) -> dict:
    """Bytes per rank for a model of ``params_billion`` x 1e9 parameters; pure arithmetic, instant - the
    ZeRO paper's table for lesson 01 (``dpteach.replica.model_states.model_state_bytes`` says what it returns)."""
    return model_state_bytes(params_billion, optimizer, precision, world_size, zero_stage, gpu_gb)


def _tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def measure_model_memory(models=None, optimizers=("sgd_momentum", "adam"), batch: int = 8,
                         device: str = "auto") -> list[dict]:
    """Count the real bytes of each model's parameters, gradients and optimizer state after one step.

    fp32 only (the course trains in fp32 on every device). Optimizer state is split into the
    per-parameter buffers the table predicts (momentum; Adam's two moments) and everything else
    (Adam keeps a one-element ``step`` counter per parameter tensor). ``device="auto"``: the first GPU
    where there is one, else the CPU; ``models=None``: the laptop models, and on a GPU the GPU-sized
    ones too (at a batch of 2 sequences: the states are the point, not the activations). On a GPU each
    row also has ``allocator_peak_bytes``, the most the caching allocator held at once during the step
    (``torch.cuda.max_memory_allocated``): the counted tensors plus the activations and the kernels'
    workspaces. Returns one row per (model, optimizer)::

        {"model", "optimizer", "num_params", "num_tensors", "param_bytes", "grad_bytes",
         "state_bytes" (per-parameter buffers), "other_state_bytes", "predicted": {params, grads, optimizer},
         "allocator_peak_bytes" (None on the CPU), "device"}
    """
    validate.choice("device", device, ("auto", "cpu", "cuda"))
    if device == "auto":
        device = "cuda" if visible_gpus() else "cpu"
    on = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
    default = model_names("cpu") + (model_names("gpu") if on.type == "cuda" else [])
    rows = []
    for name in (models or default):
        n_samples = batch if SPECS[name].sized_for == "cpu" else min(batch, 2)
        data = make_dataset(name, n_samples, seed=0)
        x, y = (t.to(on) for t in sample_batch(data, range(n_samples)))
        for opt_name in optimizers:
            validate.choice("optimizers", opt_name, OPTIMIZERS)
            if on.type == "cuda":
                torch.cuda.empty_cache()
                start = torch.cuda.memory_allocated(on)
                torch.cuda.reset_peak_memory_stats(on)
            model = build_model(name, seed=0, device=on)
            params = [p for p in model.parameters() if p.requires_grad]
            if opt_name == "adam":
                opt = torch.optim.Adam(params, lr=1e-3)
            else:
                opt = torch.optim.SGD(params, lr=0.01, momentum=0.9 if opt_name == "sgd_momentum" else 0.0)
            with plain_fp32(str(on)):
                loss_fn(name)(model(x), y).backward()
            opt.step()  # optimizer state is created lazily, on the first step
            peak = torch.cuda.max_memory_allocated(on) - start if on.type == "cuda" else None
            state = [opt.state[p] for p in params]
            per_param = [v for s, p in zip(state, params) for v in s.values()
                         if isinstance(v, torch.Tensor) and v.shape == p.shape]
            everything = [v for s in state for v in s.values() if isinstance(v, torch.Tensor)]
            n = sum(p.numel() for p in params)
            p_b, g_b, o_b = BYTES_PER_PARAM[("fp32", opt_name)]
            rows.append({
                "model": name, "optimizer": opt_name, "num_params": n, "num_tensors": len(params),
                "param_bytes": _tensor_bytes(params), "grad_bytes": _tensor_bytes(p.grad for p in params),
                "state_bytes": _tensor_bytes(per_param),
                "other_state_bytes": _tensor_bytes(everything) - _tensor_bytes(per_param),
                "predicted": {"params": p_b * n, "grads": g_b * n, "optimizer": o_b * n},
                "allocator_peak_bytes": peak, "device": str(on),
            })
            del model, opt, params, state, per_param, everything
    return rows
