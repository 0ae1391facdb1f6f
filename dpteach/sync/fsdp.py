"""``fsdp``: torch's FSDP2, ``fully_shard`` on every layer - the reference for ``zero3``, as ``ddp`` is for ``overlap``.

``fully_shard(layer)`` turns each parameter of the layer into a DTensor sharded on dim 0 across the W
ranks; the layer's parameters are all-gathered before its forward and freed after it
(``reshard_after_forward=True``), all-gathered again for backward, and their gradients are
reduce-scattered as soon as backward has produced them. In backward the next layer's all-gather is
issued one layer early (explicit prefetching); in forward, on GPUs, a separate all-gather stream lets
the CPU issue it early too (implicit prefetching), which CPU tensors, without streams, do not get -
``fsdp_trace.py`` reads both from a profile. The optimizer is built *after*
``fully_shard``, over the sharded DTensor parameters, and steps only the local shards. Sources: the
``fully_shard`` docstrings and the FSDP2 tutorial (docs.pytorch.org); Zhao et al., "PyTorch FSDP",
VLDB 2023. FSDP2 runs on gloo with CPU tensors, so all of this runs on a laptop too.

What this file adds is only measurement: the bytes a step sends, counted from the sizes FSDP2 shards
(it pads each parameter's dim 0 to a multiple of W), and, for the peak, a layer's unsharded
parameters while its forward runs - all that hooks outside FSDP2 can see. FSDP2's own prefetch and
reduce-scatter buffers are not counted, so its peak is a lower bound.
"""
from contextlib import contextmanager

from ..ranks import context
from .base import GradientSync
from .sharding import parameter_units, unit_parameters


class TorchFSDP(GradientSync):
    name = "fsdp"
    label = "fsdp (torch's FSDP2)"
    shards = ("optimizer state", "gradients", "parameters")
    emulates_link = False  # FSDP2 calls torch's collectives itself: none passes through the course's link
    measures_exposure = False  # ... and waits for them inside its hooks
    emulates_peers = False  # its shards are real: one rank cannot hold a W-rank world's 1/W

    def __init__(self, model, timeline, **options):
        from torch.distributed.fsdp import fully_shard
        super().__init__(model, timeline, **options)
        mesh = self.fsdp_mesh()
        self.layers = parameter_units(model)  # as zero3's: an attention block with its output projection
        self.unsharded = {}  # layer -> bytes of its parameters all-gathered: each local shard, padded, times W
        for layer in self.layers:
            fully_shard(layer, mesh=mesh)
            self.unsharded[layer] = sum(p.to_local().numel() * p.element_size() * self.world
                                        for p in unit_parameters(layer))
            self.handles += [layer.register_forward_pre_hook(lambda m, inputs: self.hold(self.unsharded[m])),
                             layer.register_forward_hook(lambda m, inputs, output: self.release(self.unsharded[m]))]
        fully_shard(model, mesh=mesh)  # the root: groups whatever parameters no layer took (none here) and drives the rest
        self.params = [p for p in model.parameters() if p.requires_grad]

    def fsdp_mesh(self):
        """The mesh ``fully_shard`` shards across: every rank (None), or the strategy's group as a 1-D mesh
        (``hsdp.py``'s ``hsdp_torch`` gives a 2-D one)."""
        from torch.distributed.device_mesh import DeviceMesh
        group = self.comm.group
        return None if group is None else DeviceMesh.from_group(group, context.device().type)

    @contextmanager
    def micro_batch(self, sync: bool):
        self.will_sync = sync
        self.model.set_requires_gradient_sync(sync)  # FSDP2's no_sync: keep unsharded gradients, no reduce-scatter
        yield
        # FSDP2 sends through torch, not through self.comm, which counts them as the ring would: every
        # micro-batch gathers every layer for forward and again for backward; the last one also
        # reduce-scatters each layer's gradient.
        for layer in self.layers:
            for kind in ("all_gather", "all_gather") + (("reduce_scatter",) if sync else ()):
                self.comm.count(kind, self.unsharded[layer])

    def finish(self, step: int) -> None:
        pass  # FSDP2 has already reduce-scattered the gradients inside backward

    def held_tensors(self) -> list:
        return [t for p in self.model.parameters() for t in (p, p.grad)]
