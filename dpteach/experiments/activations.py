"""How big a batch (lesson 15): activation memory per sample, and what activation checkpointing trades for it.

* ``activation_memory`` measures, per model, the bytes a forward pass keeps for backward per sample and
  the bytes that do not grow with the batch (two batch sizes, the slope: ``dpteach/replica/activations.py``),
  puts them beside the model states (parameters, gradients and optimizer state in fp32, the ZeRO paper's
  arithmetic of ``dpteach/replica/model_states.py``) and answers the lesson's question: the largest
  micro-batch that fits a device of ``memory_gb``, with and without checkpointing every block.
* ``checkpointing`` measures what checkpointing every block saves of those bytes and what it costs: the
  whole training step (forward, backward, optimizer step) with and without, timed in one process,
  interleaved. The price is a second forward of every block during backward (Chen et al., "Training Deep
  Nets with Sublinear Memory Cost", 2016): about one forward more per step, a step about a third longer
  when backward costs twice a forward.

Both run in this process on one device, no ranks: activations are a rank's own business. Data parallelism
does not shard them - each rank holds those of its own micro-batch, whatever W and whatever ZeRO stage -
so the micro-batch that fits is a per-rank question, and gradient accumulation (lesson 05) or more ranks
make the global batch from it.
"""
from __future__ import annotations

import math
import statistics
import time

import torch

from .. import validate
from ..measure import interleaved, spread
from ..units import human_bytes
from ..ranks.backend import plain_fp32, visible_gpus
from ..replica.activations import activation_profile, checkpointed
from ..replica.data import loss_fn, make_dataset, sample_batch
from ..replica.model_states import GB, OPTIMIZERS, model_state_bytes
from ..replica.models import (DEFAULT_LR, LAPTOP_BATCH_PER_RANK, SPECS, build_model, check_model_name,
                              default_batch_per_rank, model_names, parameter_count)

SOURCE = ("saved tensors counted under torch.autograd.graph.saved_tensors_hooks, one forward pass, each storage "
          "once, parameters and buffers left out (dpteach/replica/activations.py)")


def _device(device: str) -> str:
    validate.choice("device", device, ("auto", "cpu", "cuda"))
    if device == "auto":
        return "cuda:0" if visible_gpus() else "cpu"
    if device == "cuda" and not visible_gpus():
        raise validate.refusal("device", device, "no GPU is visible here: use 'cpu' or 'auto'")
    return "cuda:0" if device == "cuda" else "cpu"


def _models(models, on: str, default) -> list[str]:
    names = list(default) if models is None else [models] if isinstance(models, str) else list(models)
    if not names:
        raise validate.refusal("models", models, "name one model or more")
    for name in names:
        check_model_name(name)
        if SPECS[name].sized_for == "gpu" and not on.startswith("cuda"):
            raise validate.refusal("models", name, "a GPU-sized model is measured on a GPU, at the batch it "
                                   "trains with there; on the CPU choose mlp, cnn or transformer")
    return names


def _largest_batch(memory: float, states: float, fixed: float, per_sample: float) -> tuple[int, str | None]:
    room = memory - states - fixed
    if room < per_sample:
        return 0, (f"the model states alone ({human_bytes(states)}) leave no room for one sample's "
                   f"{human_bytes(per_sample)} of activations" if states < memory
                   else f"the model states alone ({human_bytes(states)}) do not fit")
    return math.floor(room / per_sample), None


def activation_memory(models=None, batch: int = LAPTOP_BATCH_PER_RANK, memory_gb: float = 80.0,
                      optimizer: str = "adam", device: str = "auto") -> dict:
    """Per model: activation bytes per sample and fixed, model states, and the largest micro-batch that fits.

    ``models=None``: the laptop models (mlp, cnn, transformer) and, on a GPU, the GPU-sized transformers
    too; each GPU-sized one at its own per-rank batch (``ModelSpec.batch_per_rank``), the laptop ones at
    ``batch`` (the course's per-rank 32). Activations are measured at ``batch // 2`` and ``batch``;
    ``per_sample_bytes`` is the slope, ``fixed_bytes`` the rest (a few bytes: the loss's scalars).
    Model states are fp32 with ``optimizer``: 4 + 4 + 0, 4 or 8 bytes per parameter (``replica/model_states.py``).
    The largest micro-batch is ``floor((memory - states - fixed) / per_sample)`` (0, with the reason in
    ``why``, when not one sample fits). With checkpointing around every block it uses the peak during
    backward - the kept block inputs plus the largest block's internals, recomputed one block at a time -
    not the smaller bytes kept between forward and backward. Left out: the kernels' workspaces, the
    allocator's rounding and fragmentation, and backward's transient gradient buffers (on a GPU,
    ``allocator_bytes`` shows what CUDA's allocator held after forward).

    Returns ``{"memory_gb", "optimizer", "device", "source", "note", "rows": [{"model", "batch", "num_params",
    "state_bytes", "saved_bytes", "per_sample_bytes", "fixed_bytes", "checkpointed_saved_bytes",
    "checkpointed_peak_bytes", "checkpointed_per_sample_bytes", "checkpointed_fixed_bytes",
    "largest_micro_batch", "largest_micro_batch_checkpointed", "why", "allocator_bytes"}]}``.
    """
    validate.integer("batch", batch, low=2, why=" (the slope needs two batch sizes: batch // 2 and batch)")
    validate.number("memory_gb", memory_gb, above=0, unit="a number of GB")
    validate.choice("optimizer", optimizer, OPTIMIZERS)
    on = _device(device)
    names = _models(models, on, model_names("cpu") + (model_names("gpu") if on.startswith("cuda") else []))
    memory = memory_gb * GB
    rows = []
    for name in names:
        at = batch if SPECS[name].sized_for == "cpu" else default_batch_per_rank(name)
        with plain_fp32(on):
            plain = activation_profile(name, at, 0, on)
            ckpt = activation_profile(name, at, 1, on)
        n = parameter_count(name)
        states = model_state_bytes(n / 1e9, optimizer, "fp32", world_size=1, gpu_gb=memory_gb)["replica_bytes"]["total"]
        fits, why = _largest_batch(memory, states, plain["fixed_bytes"], plain["per_sample_bytes"])
        fits_ckpt, _ = _largest_batch(memory, states, ckpt["peak_fixed_bytes"], ckpt["peak_per_sample_bytes"])
        rows.append({"model": name, "batch": at, "num_params": n, "state_bytes": states,
                     "saved_bytes": plain["saved_bytes"], "per_sample_bytes": plain["per_sample_bytes"],
                     "fixed_bytes": plain["fixed_bytes"], "checkpointed_saved_bytes": ckpt["saved_bytes"],
                     "checkpointed_peak_bytes": ckpt["peak_bytes"],
                     "checkpointed_per_sample_bytes": ckpt["peak_per_sample_bytes"],
                     "checkpointed_fixed_bytes": ckpt["peak_fixed_bytes"], "largest_micro_batch": fits,
                     "largest_micro_batch_checkpointed": fits_ckpt, "why": why,
                     "allocator_bytes": plain["allocator_bytes"]})
    if on.startswith("cuda"):  # the models measured here are gone: give their memory back to the GPU
        torch.cuda.empty_cache()
    return {"memory_gb": memory_gb, "optimizer": optimizer, "device": on, "source": SOURCE,
            "note": "fp32; per-sample bytes from the slope between batch // 2 and batch; with checkpointing, the "
                    "peak during backward (kept inputs + the largest block recomputed); workspaces, fragmentation "
                    "and backward's transient buffers not included", "rows": rows}


def _timed(step, on: str) -> float:
    if on.startswith("cuda"):
        torch.cuda.synchronize(on)
    start = time.perf_counter()
    step()
    if on.startswith("cuda"):
        torch.cuda.synchronize(on)
    return time.perf_counter() - start


def checkpointing(models=("mlp", "transformer"), batch: int = LAPTOP_BATCH_PER_RANK, repeats: int = 10,
                  warmup: int = 2, threads: int = 1, device: str = "cpu") -> dict:
    """What checkpointing every block saves and costs, per model, at a micro-batch of ``batch``.

    Bytes: what the forward keeps for backward without and with checkpointing, the share saved, and the peak
    during backward with it (the kept inputs plus the largest block's internals, recomputed). Time: one whole
    training step - zero_grad, forward, loss, backward, SGD with momentum at the model's learning rate - of
    the plain model and of the checkpointed one (the same parameters, one optimizer), and a plain forward
    alone; the three alternate within every repeat, the order turning each time, after ``warmup`` rounds;
    medians, and beside them (``dpteach.measure``) each median's interval and the intervals of the ratios taken
    round by round. ``predicted_ratio`` is (step + forward) / step, the price of one forward more;
    ``versus_prediction`` says whether the measured ratio's interval lies above, below or within the
    predicted one's, and ``slower`` whether the checkpointed step's interval lies wholly above the plain one's. The measured ratio
    can fall below it (the embeddings, the head and the loss are not recomputed, and the checkpointed
    forward saves nothing) or rise above it where blocks are so small that checkpoint's own bookkeeping,
    tens of microseconds per block and pass, is not small beside them (the MLP's). The default batch is the
    course's per-rank 32, where a step of the tiny transformer is compute, not overhead, and its saved
    activations (about 14 MB) outweigh its parameters twelvefold. ``threads`` CPU threads (one: the course's
    CPU ranks compute on one core each), restored after.

    Returns ``{"batch", "repeats", "threads", "device", "source", "note", "rows": [{"model", "blocks",
    "saved_bytes", "checkpointed_saved_bytes", "share_saved", "recompute_bytes", "checkpointed_peak_bytes",
    "peak_share_saved", "same_loss", "max_grad_diff", "plain_step_s", "checkpointed_step_s", "forward_s",
    "step_time_ratio", "predicted_ratio", "plain_step", "checkpointed_step", "ratio", "predicted" (each
    ``Spread.as_dict()``), "slower", "versus_prediction"}]}``.
    """
    validate.integer("batch", batch, low=2, why=" (the slope needs two batch sizes: batch // 2 and batch)")
    validate.integer("repeats", repeats, low=1)
    validate.integer("warmup", warmup, low=0)
    validate.integer("threads", threads, low=1)
    on = _device(device)
    names = _models(models, on, ())
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with plain_fp32(on):
            rows = [_checkpointing_row(name, batch, repeats, warmup, on) for name in names]
    finally:
        torch.set_num_threads(before)
    return {"batch": batch, "repeats": repeats, "threads": threads, "device": on, "source": SOURCE,
            "note": "step times: medians of interleaved repeats in this process (plain, checkpointed and forward "
                    "alone in turn, the order turning), after warm-up, with the interval of each median "
                    "(dpteach.measure); a claim is made only where intervals separate",
            "rows": rows}


def _checkpointing_row(name: str, batch: int, repeats: int, warmup: int, on: str) -> dict:
    plain, ckpt = activation_profile(name, batch, 0, on), activation_profile(name, batch, 1, on)
    model = build_model(name, seed=0, device=on)
    wrapped = checkpointed(model)
    criterion = loss_fn(name)
    x, y = (t.to(on) for t in sample_batch(make_dataset(name, batch, seed=0), range(batch)))
    opt = torch.optim.SGD(model.parameters(), lr=DEFAULT_LR[name], momentum=0.9)

    def grads(run):
        model.zero_grad(set_to_none=True)
        loss = criterion(run(x), y)
        loss.backward()
        return loss.item(), [p.grad.clone() for p in model.parameters()]

    (loss_a, grads_a), (loss_b, grads_b) = grads(model), grads(wrapped)  # before any step: the same weights

    def step(run):
        opt.zero_grad(set_to_none=True)
        criterion(run(x), y).backward()
        opt.step()

    def forward():
        criterion(model(x), y)

    kinds = {"plain": lambda: step(model), "checkpointed": lambda: step(wrapped), "forward": forward}
    # interleaved rounds, the order turning every round; each call times itself with the device synchronised
    times = interleaved({kind: (lambda f=f: _timed(f, on)) for kind, f in kinds.items()}, repeats, warmup,
                        self_timed=True, samples=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    # Ratios round by round: the three timings of one round saw the same moment of the machine, so the
    # spread of their ratio is the machine's noise on the ratio itself, not the sum of two spreads.
    ratio = spread(c / p for c, p in zip(times["checkpointed"], times["plain"]))
    predicted = spread((p + f) / p for p, f in zip(times["plain"], times["forward"]))
    plain_s, ckpt_s = spread(times["plain"]), spread(times["checkpointed"])
    return {"model": name, "batch": batch, "blocks": plain["blocks"], "saved_bytes": plain["saved_bytes"],
            "checkpointed_saved_bytes": ckpt["saved_bytes"],
            "share_saved": 1 - ckpt["saved_bytes"] / plain["saved_bytes"], "recompute_bytes": ckpt["recompute_bytes"],
            "checkpointed_peak_bytes": ckpt["peak_bytes"],
            "peak_share_saved": 1 - ckpt["peak_bytes"] / plain["saved_bytes"],
            "same_loss": loss_a == loss_b,
            "max_grad_diff": max((a - b).abs().max().item() for a, b in zip(grads_a, grads_b)),
            "plain_step_s": med["plain"], "checkpointed_step_s": med["checkpointed"], "forward_s": med["forward"],
            "step_time_ratio": med["checkpointed"] / med["plain"],
            "predicted_ratio": (med["plain"] + med["forward"]) / med["plain"],
            "plain_step": plain_s.as_dict(), "checkpointed_step": ckpt_s.as_dict(),
            "ratio": ratio.as_dict(), "predicted": predicted.as_dict(),
            "slower": plain_s.below(ckpt_s),
            "versus_prediction": _versus(ratio, predicted)}


def _versus(measured, predicted) -> str:
    """'above', 'below' or 'within': where the measured ratio's interval lies against the predicted one's."""
    if predicted.below(measured):
        return "above"
    if measured.below(predicted):
        return "below"
    return "within"
