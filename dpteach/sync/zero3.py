"""``zero3``: ZeRO stage 3 - parameters sharded too, gathered layer by layer just before they are used.

Between uses a rank keeps only shard r of each layer's parameters (plus shard r of its gradient and
optimizer state): Psi x (2 + 2 + K) / W bytes in the ZeRO paper's accounting (P_os+g+p). A layer's
full parameters exist only while it computes::

    forward, layer i:   all-gather layer i  -> forward i  -> free layer i's full parameters
    backward, layer i:  all-gather layer i  -> backward i -> reduce-scatter its gradient -> free

That is one all-gather more per step than stages 1-2 (the parameters are gathered again for
backward), so a rank sends 3 x (W-1)/W x Psi instead of 2 x: 1.5 times the traffic of DDP (ZeRO,
Rajbhandari et al. 2020, section 7.2.2). The cost can hide behind compute: from the second step on,
the all-gather of the *next* layer - next in forward order, or next in backward order, which is the
reverse - is launched before the current layer computes (prefetching; FSDP does the same, Zhao et
al., "PyTorch FSDP", VLDB 2023). The order is the one the first step ran in; FSDP2 instead records
the order afresh in every forward and prefetches from it in that iteration's backward, so it follows a
model whose order changes, where this file, written for the course's fixed models, does not.
"""
import torch

from .base import ReadyCount
from .sharding import FlatGroup, ShardedSync, parameter_units, unit_parameters


class Zero3(ShardedSync):
    name = "zero3"
    label = "zero3: + parameters"
    shards = ("optimizer state", "gradients", "parameters")
    takes_all_reduce = ("ring",)  # its reduce-scatter and all-gather on the ring of lesson 02

    def __init__(self, model, timeline, **options):
        super().__init__(model, timeline, **options)
        self.groups = []
        for layer in parameter_units(model):  # a layer, or an attention block with its output projection
            group = FlatGroup(unit_parameters(layer), self.world, self.rank)
            group.shard = torch.nn.Parameter(group.shard.detach().clone())  # its own storage: the flat buffer goes
            group.flat.untyped_storage().resize_(0)  # the layer's parameters now point at nothing
            self.groups.append(group)
            self.handles += [layer.register_forward_pre_hook(self._before_forward(group)),
                             layer.register_forward_hook(self._after_forward(group))]
        self.group_of = {p: g for g in self.groups for p in g.params}
        self.handles += [p.register_post_accumulate_grad_hook(self._on_gradient_ready) for p in self.params]
        self.order, self.recorded = [], False  # the groups in the order the first forward used them
        self.gathering, self.ready = {}, ReadyCount(self.groups)
        self.reporting = False  # gathering for the run's final report: not part of any step
        self.notes = {"prefetched": 0, "on_demand": 0}

    # -- gathering and freeing a layer's full parameters ----------------------------------------
    def _launch_gather(self, group) -> None:
        if group in self.gathering or group.flat.untyped_storage().nbytes() > 0:
            return  # on its way already, or already here
        group.flat.untyped_storage().resize_(group.nbytes)
        self.hold(group.nbytes)
        self.gathering[group] = self._start_gather(group)

    def _start_gather(self, group):
        """Launch the all-gather of ``group``'s shards into its flat buffer; what ``_finish_gather`` waits for.
        (ZeRO++, ``zeropp.py``, gathers otherwise: quantised, or from inside the node.)"""
        work = self.comm.all_gather_into_tensor(group.flat, group.shard.detach(), async_op=True)
        if not self.reporting:
            self.comm.launched(work, "all_gather")
        return work

    def _finish_gather(self, group, work) -> None:
        self.comm.wait(work)

    def _gather(self, group) -> None:
        if not self.reporting:  # was it asked for early (prefetched), or only now that it is needed?
            ahead = group in self.gathering or group.flat.untyped_storage().nbytes() > 0
            self.notes["prefetched" if ahead else "on_demand"] += 1
        self._launch_gather(group)
        if group in self.gathering:
            if self.reporting:
                self._finish_gather(group, self.gathering.pop(group))
                return
            with self.comm.waiting():  # the layer cannot compute until its parameters arrive
                self._finish_gather(group, self.gathering.pop(group))

    def _free(self, group) -> None:
        if group.flat.untyped_storage().nbytes() > 0:
            group.flat.untyped_storage().resize_(0)
            self.release(group.nbytes)

    def _prefetch(self, group, ahead: int) -> None:
        """Launch the all-gather of the layer ``ahead`` places after ``group`` in the recorded order."""
        if self.recorded:
            position = self.order.index(group) + ahead
            if 0 <= position < len(self.order):
                self._launch_gather(self.order[position])

    # -- forward: gather, compute, free; backward: gather again when the output's gradient arrives --
    def _before_forward(self, group):
        def hook(module, inputs):
            if not self.recorded:
                self.order.append(group)
            self._gather(group)
            self._prefetch(group, +1)
        return hook

    def _after_forward(self, group):
        def hook(module, inputs, output):
            self._free(group)
            outputs = output if isinstance(output, (tuple, list)) else (output,)
            for tensor in outputs:
                if torch.is_tensor(tensor) and tensor.requires_grad:
                    tensor.register_hook(self._before_backward(group))
                    break
        return hook

    def _before_backward(self, group):
        def hook(grad):
            self._gather(group)
            self._prefetch(group, -1)
            return grad
        return hook

    def _on_gradient_ready(self, param) -> None:
        self.comm.poll()
        group = self.group_of[param]
        if self.ready.arrived(group):
            self._free(group)
            if self.will_sync:
                self.launch_reduce_scatter(group)

    # -- the trainer's calls ----------------------------------------------------------------------
    def start_step(self, step: int) -> None:
        super().start_step(step)
        self.notes = {"prefetched": 0, "on_demand": 0}  # this step's all-gathers, by when they were asked for

    def finish(self, step: int) -> None:
        for group in self.groups:  # a layer that got no gradient this step still takes part
            if not self.ready.complete(group):
                self._free(group)
                self.launch_reduce_scatter(group)
        self.wait_reduce_scatters(step)
        self.recorded = True

    def micro_batch(self, sync: bool):
        self.ready.reset()  # every micro-batch runs every layer again
        return super().micro_batch(sync)

    def held_tensors(self) -> list:
        return super().held_tensors() + [t for g in self.groups for t in (g.flat, g.shard, g.grad_shard)]

    def unshard(self) -> None:
        """Every layer's full parameters, for the weights a run reports at its end."""
        self.reporting = True
        for group in self.groups:
            self._gather(group)
