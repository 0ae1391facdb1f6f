"""``zero1``: ZeRO stage 1 - each rank keeps the optimizer state of its own shard only.

After backward every rank holds full gradients, as in ``bucketed``. Instead of all-reducing them,
each bucket is *reduce-scattered*: rank r receives the average of shard r and nothing else. It
steps the optimizer on shard r alone - so Adam's two moments exist for 1/W of the parameters on each
rank - and an *all-gather* then hands every rank every updated shard::

    bucketed:  all-reduce(grads)                 -> every rank steps every parameter
    zero1:     reduce-scatter(grads) -> step shard r -> all-gather(params)

A reduce-scatter plus an all-gather is exactly what a ring all-reduce sends (lesson 02), so the
traffic equals ``bucketed``'s; the optimizer state per rank shrinks from K x Psi to K x Psi / W
(ZeRO, Rajbhandari et al. 2020, the P_os stage). Parameters and gradients stay whole on every rank.
"""
import torch

from .sharding import ShardedSync, shard_buckets


class Zero1(ShardedSync):
    name = "zero1"
    label = "zero1: optimizer state"
    shards = ("optimizer state",)
    takes_all_reduce = ("ring",)  # its reduce-scatter and all-gather on the ring of lesson 02

    def __init__(self, model, timeline, bucket_mb=1.0, first_bucket_mb=None, **options):
        super().__init__(model, timeline, **options)
        self.groups = shard_buckets(model, self.world, self.rank, bucket_mb, first_bucket_mb)
        for group in self.groups:  # the gradients live in one flat buffer per bucket too, as DDP's bucket views
            group.flat_grad = torch.zeros_like(group.flat)
            for p, offset in zip(group.params, group.offsets):
                p.grad = group.flat_grad[offset:offset + p.numel()].view_as(p)  # backward adds into it in place
            start = group.shard.numel() * self.rank
            group.grad_shard = group.flat_grad[start:start + group.shard.numel()]  # shard r of the average lands here

    def finish(self, step: int) -> None:
        for index, group in enumerate(self.groups):
            average = torch.empty_like(group.grad_shard)  # a reduce-scatter may not write into its own input
            self.hold(average.numel() * average.element_size())
            with self.comm.exchange("reduce_scatter", bucket=index):
                group.flat_grad.div_(self.world)
                self.comm.reduce_scatter(average, group.flat_grad)
            group.grad_shard.copy_(average)
            self.release(average.numel() * average.element_size())
            group.shard.grad = group.grad_shard

    def step_optimizer(self, optimizer) -> None:
        optimizer.step()  # updates shard r in place, inside the flat buffer the model reads
        self.note_state(optimizer)
        for group in self.groups:
            group.shard.grad = None
            group.flat_grad.zero_()  # the parameters' gradients are views into it: zeroed, not freed
        self.gather_updated()

    def held_tensors(self) -> list:
        return super().held_tensors() + [t for g in self.groups for t in (g.flat, g.flat_grad)]
