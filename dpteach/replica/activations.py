"""Activation memory, measured: what one forward pass keeps for backward, and what checkpointing keeps instead.

Model states (parameters, gradients, optimizer state: ``model_states.py``) do not depend on the batch.
Activations do: to compute gradients, backward needs tensors that forward computed - the input of every
matrix product, the pre-activation of every GELU, the statistics of every norm - and autograd keeps
them from the moment forward makes them until backward has used them. Their bytes grow with the samples
of a micro-batch, so they, not the model, set the largest micro-batch a device can take.

:func:`saved_activation_bytes` counts them as autograd sees them. One forward runs under
``torch.autograd.graph.saved_tensors_hooks``: every tensor an operation saves for backward passes
through the pack hook, which notes its storage (``untyped_storage``) and hands the tensor back
unchanged. Each storage counts once (a view, a transpose, a slice of q/k/v saves no new bytes), and the
storages of the model's parameters and buffers are left out: they are model state, held anyway. The
batch's own tensors are counted (the first layer keeps its input until backward) and reported apart.

**Activation checkpointing** (Chen et al., "Training Deep Nets with Sublinear Memory Cost", 2016;
``torch.utils.checkpoint``) keeps only each block's input and runs the block's forward a second time
during backward, when its internals are needed. :func:`checkpointed` runs a model that way, with
``checkpoint(block, ..., use_reentrant=False)`` around every block (or every k-th), sharing the model's
own parameters. How that shows under the pack hook, in torch 2.13 (``torch/utils/checkpoint.py``,
``_checkpoint_without_reentrant_generator``): before the block runs, ``_CheckpointFrame.save_inputs``
wraps its tensor inputs with ``_make_saved_tensor`` - an ordinary saved tensor, so the *outer* hooks,
ours, pack it - and only then enters ``_checkpoint_hook``, the innermost saved-tensors hook while the
block runs, which replaces everything the block saves by an empty ``_Holder``. (Older releases saved the
inputs through a no-op autograd Function, ``_NoopSaveInputs``, with the same effect.) So under
checkpointing the hook sees exactly what is held until backward: the block inputs checkpoint keeps, and
whatever runs outside the blocks. Two things the hook cannot see: tensors a block receives as keyword
arguments, which checkpoint's closure holds for the recomputation - the transformer's causal mask, which
``nn.TransformerEncoder`` turns into one float tensor of seq x seq for all its layers (4 KiB at 32 tokens,
4 MiB at 1024: fixed, not per sample) - and the RNG state checkpoint stashes to replay dropout, which
:func:`checkpointed` turns off (``preserve_rng_state=False``): the course's models draw no random numbers
in forward (``models.py``).

During backward a checkpointed block's internals exist again, one block at a time: the peak holds the
kept inputs plus the largest block's recomputed internals. :func:`activation_profile` reports both, and
separates what grows with the batch from what does not by measuring two batch sizes (the slope).
"""
from __future__ import annotations

import copy

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .. import validate
from .data import loss_fn as course_loss, make_dataset, sample_batch
from .models import SPECS, MLP, SmallCNN, TinyTransformer, build_model, check_model_name

# Where each model's repeated blocks are: the container (a dotted path) and how many of its children
# make one block. The MLP: Linear + GELU pairs (its last Linear, alone, is no block); the CNN: its three
# conv stages (Conv2d, GroupNorm, GELU); the transformers: their encoder layers.
LAYOUT = {MLP: ("net", 2), SmallCNN: ("features", 3), TinyTransformer: ("blocks.layers", 1)}


def _layout(model: nn.Module) -> tuple[str, int] | None:
    return LAYOUT.get(type(model))


def _checked_layout(model: nn.Module) -> tuple[str, int]:
    layout = _layout(model)
    if layout is None:
        raise validate.refusal("model", type(model).__name__, "give one of the course's models "
                               "(MLP, SmallCNN, TinyTransformer) or its name: only their blocks are known")
    return layout


def _container(model: nn.Module, path: str) -> nn.Module:
    for name in path.split("."):
        model = getattr(model, name)
    return model


def _groups(model: nn.Module) -> list[list[nn.Module]]:
    """The model's blocks, each as the list of modules it is made of, in forward order (none for a model
    that is not the course's)."""
    if _layout(model) is None:
        return []
    path, size = _layout(model)
    children = list(_container(model, path).children())
    return [children[i:i + size] for i in range(0, len(children) - size + 1, size)]


def blocks(model: nn.Module | str) -> list[nn.Module]:
    """The model's repeated blocks, the units checkpointing wraps: the MLP's Linear+GELU pairs, the CNN's
    conv stages, a transformer's encoder layers (``model.blocks.layers``). A block of several modules comes
    back as an ``nn.Sequential`` of the model's own modules (same parameters). A name builds the model on
    the meta device: the blocks' structure, no memory."""
    if isinstance(model, str):
        model = build_model(check_model_name(model), device="meta")
    _checked_layout(model)
    return [group[0] if len(group) == 1 else nn.Sequential(*group) for group in _groups(model)]


class Checkpointed(nn.Module):
    """``block`` run under ``checkpoint(..., use_reentrant=False)``. Any attribute the wrapper lacks is read
    from the block, so that code around it finds what it looks for (``nn.TransformerEncoder`` reads
    ``layers[0].self_attn.batch_first``); hooks registered on the block still fire, once, inside."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block
        self.training = block.training  # in the mode of the model it stands in

    def forward(self, *args, **kwargs):
        return checkpoint(self.block, *args, use_reentrant=False, preserve_rng_state=False, **kwargs)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "block" or "_modules" not in self.__dict__:
                raise
            return getattr(self._modules["block"], name)


def checkpointed(model: nn.Module, every: int = 1) -> nn.Module:
    """``model`` run with activation checkpointing around every ``every``-th block (blocks 0, k, 2k, ...).

    A shallow copy of the model whose block container holds its blocks wrapped in :class:`Checkpointed`: it
    runs the model's own ``forward`` on the model's own parameters (gradients land in ``model``'s ``.grad``; an
    optimizer built over ``model.parameters()`` trains both), and leaves ``model`` itself as it was. The
    outputs and gradients are the plain model's (tests/test_activations.py holds them to it).
    """
    validate.integer("every", every, low=1)
    path, _ = _checked_layout(model)
    *outer, last = path.split(".")
    root = parent = copy.copy(model)
    for name in outer:  # copy the path down to the container, so that replacing it leaves model alone
        parent._modules = dict(parent._modules)
        setattr(parent, name, copy.copy(getattr(parent, name)))
        parent = getattr(parent, name)
    parent._modules = dict(parent._modules)
    container = getattr(parent, last)
    groups = _groups(model)
    runs = []
    for i, group in enumerate(groups):
        block = group[0] if len(group) == 1 else nn.Sequential(*group)
        runs.append(Checkpointed(block) if i % every == 0 else block)
    rest = list(container.children())[sum(len(g) for g in groups):]  # the MLP's last Linear
    modules = runs + rest
    setattr(parent, last, nn.Sequential(*modules) if isinstance(container, nn.Sequential) else nn.ModuleList(modules))
    return root


def _key(t: torch.Tensor) -> tuple:
    """A storage's identity: its device and address (a saved tensor is alive, so no other storage has it)."""
    storage = t.untyped_storage()
    return storage.device, storage.data_ptr()


def saved_activation_bytes(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, loss_fn,
                           checkpoint_every: int = 0) -> dict:
    """Bytes one forward pass (model and loss) keeps for backward, counted from the tensors autograd saves.

    ``checkpoint_every``: 0 runs the model as it is; k runs it with checkpointing around every k-th block
    (:func:`checkpointed`; the course's models only). ``model`` may be any module otherwise, ``loss_fn(output,
    targets)`` any loss. Every storage counts once; the model's parameters and buffers do not count
    (model state). Returns::

        {"saved_bytes": everything kept for backward,
         "batch_bytes": the part that is the batch's own tensors (inputs, targets),
         "by_block": [bytes block i saved, ...]  # its internals: what it saved while it ran, its input left
                                                 # out (that counts outside the blocks: checkpoint keeps it);
                                                 # 0 for a checkpointed block; [] for a model not the course's
         "storages": how many storages were saved,
         "allocator_bytes": on a GPU, torch.cuda.memory_allocated after forward minus before (the saved
                            tensors plus the loss and what forward left alive); None on the CPU}
    """
    if not isinstance(model, nn.Module):
        raise validate.refusal("model", type(model).__name__, "give a torch.nn.Module")
    validate.integer("checkpoint_every", checkpoint_every, low=0)
    state = {_key(t) for t in (*model.parameters(), *model.buffers())}
    batch = {_key(t) for t in (inputs, targets) if isinstance(t, torch.Tensor)}
    saved, where, running, block_inputs = {}, {}, [None], []
    groups = _groups(model)

    def enter(i: int, args) -> None:  # block i starts: its inputs are the boundary checkpointing keeps
        running[0] = i
        block_inputs.extend(a for a in args if isinstance(a, torch.Tensor))  # held, so no address is reused

    handles = []
    for i, group in enumerate(groups):  # which block is running: from its first module's start to its last's end
        handles.append(group[0].register_forward_pre_hook(lambda _, args, i=i: enter(i, args)))
        handles.append(group[-1].register_forward_hook(lambda *_: running.__setitem__(0, None)))

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = _key(t)
        if key not in state and key not in saved:
            boundary = any(_key(b) == key for b in block_inputs)
            saved[key], where[key] = t.untyped_storage().nbytes(), None if boundary else running[0]
        return t

    on_gpu = inputs.is_cuda
    if on_gpu:
        torch.cuda.synchronize(inputs.device)
        before = torch.cuda.memory_allocated(inputs.device)
    run = checkpointed(model, checkpoint_every) if checkpoint_every else model
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = loss_fn(run(inputs), targets)
        allocator = None
        if on_gpu:
            torch.cuda.synchronize(inputs.device)
            allocator = torch.cuda.memory_allocated(inputs.device) - before
    finally:
        for handle in handles:
            handle.remove()
    del loss  # the graph and everything it saved go with it
    block_inputs.clear()
    return {"saved_bytes": sum(saved.values()), "batch_bytes": sum(n for k, n in saved.items() if k in batch),
            "by_block": [sum(n for k, n in saved.items() if where[k] == i) for i in range(len(groups))],
            "storages": len(saved), "allocator_bytes": allocator}


def _batch(name: str, size: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    return tuple(t.to(device) for t in sample_batch(make_dataset(name, size, seed=0), range(size)))


def activation_profile(name: str, batch: int, checkpoint_every: int = 0, device: str = "cpu") -> dict:
    """Model ``name``'s activation memory at a micro-batch of ``batch``, split into what grows with the batch
    and what does not, measured at ``batch // 2`` and ``batch`` samples: ``per_sample_bytes`` is the slope
    between them, ``fixed_bytes`` what is left at zero samples. With ``checkpoint_every`` > 0 the peak
    during backward adds the largest checkpointed block's recomputed internals (``recompute_bytes``, its
    ``by_block`` measured without checkpointing), and the per-sample and fixed peaks include it.

    Returns ``{"model", "batch", "checkpoint_every", "saved_bytes" (at batch), "batch_bytes",
    "per_sample_bytes", "fixed_bytes", "recompute_bytes", "peak_bytes", "peak_per_sample_bytes",
    "peak_fixed_bytes", "allocator_bytes", "blocks"}``.
    """
    check_model_name(name)
    validate.integer("batch", batch, low=2, why=" (the slope needs two batch sizes: batch // 2 and batch)")
    validate.integer("checkpoint_every", checkpoint_every, low=0)
    model = build_model(name, seed=0, device=device)
    criterion = course_loss(name)
    half, full = (saved_activation_bytes(model, *_batch(name, b, device), criterion, checkpoint_every)
                  for b in (batch // 2, batch))
    plain = [saved_activation_bytes(model, *_batch(name, b, device), criterion) if checkpoint_every else m
             for b, m in ((batch // 2, half), (batch, full))]
    wrapped = range(0, len(_groups(model)), checkpoint_every) if checkpoint_every else ()
    recompute = [max((p["by_block"][i] for i in wrapped), default=0) for p in plain]
    step = batch - batch // 2

    def slope(small, large):
        per_sample = (large - small) / step
        return per_sample, large - per_sample * batch

    per_sample, fixed = slope(half["saved_bytes"], full["saved_bytes"])
    peak_per_sample, peak_fixed = slope(half["saved_bytes"] + recompute[0], full["saved_bytes"] + recompute[1])
    return {"model": name, "batch": batch, "checkpoint_every": checkpoint_every, "saved_bytes": full["saved_bytes"],
            "batch_bytes": full["batch_bytes"], "per_sample_bytes": per_sample, "fixed_bytes": fixed,
            "recompute_bytes": recompute[1], "peak_bytes": full["saved_bytes"] + recompute[1],
            "peak_per_sample_bytes": peak_per_sample, "peak_fixed_bytes": peak_fixed,
            "allocator_bytes": full["allocator_bytes"], "blocks": len(_groups(model)),
            "device": str(device), "sized_for": SPECS[name].sized_for}
