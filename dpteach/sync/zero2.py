"""``zero2``: ZeRO stage 2 - gradients are sharded too, reduce-scattered during backward.

Stage 1 still holds every gradient until backward ends. Stage 2 does not need to: the moment a
bucket's gradients are all ready (the hooks of ``overlap.py``), the bucket is reduce-scattered and
the full gradients are dropped, keeping only shard r of their average. At the optimizer step a rank
holds full parameters, 1/W of the gradients and 1/W of the optimizer state - 2 Psi + (2 + K) Psi / W
bytes in the ZeRO paper's mixed-precision accounting (Rajbhandari et al. 2020, P_os+g) - and sends
what ``zero1`` sends. With accumulation the gradients of the micro-batches that do not synchronise
stay whole, as in every strategy here, until the last one.
"""

from .base import ReadyCount
from .sharding import ShardedSync, shard_buckets


class Zero2(ShardedSync):
    name = "zero2"
    label = "zero2: + gradients"
    shards = ("optimizer state", "gradients")
    takes_all_reduce = ("ring",)  # its reduce-scatter and all-gather on the ring of lesson 02

    def __init__(self, model, timeline, bucket_mb=1.0, first_bucket_mb=None, **options):
        super().__init__(model, timeline, **options)
        self.groups = shard_buckets(model, self.world, self.rank, bucket_mb, first_bucket_mb)
        self.group_of = {p: g for g in self.groups for p in g.params}
        self.handles = [p.register_post_accumulate_grad_hook(self._on_gradient_ready) for p in self.params]
        self.ready = ReadyCount(self.groups)

    def start_step(self, step: int) -> None:
        super().start_step(step)
        self.ready.reset()

    def _on_gradient_ready(self, param) -> None:
        self.comm.poll()
        if not self.will_sync:  # a micro-batch that does not synchronise: the gradient stays whole
            return
        group = self.group_of[param]
        if self.ready.arrived(group):
            self.launch_reduce_scatter(group)

    def finish(self, step: int) -> None:
        for group in self.groups:  # parameters that got no gradient this step: send zeros for them
            if not self.ready.complete(group):
                self.launch_reduce_scatter(group)
        self.wait_reduce_scatters(step)

    def step_optimizer(self, optimizer) -> None:
        optimizer.step()
        self.note_state(optimizer)
        for group in self.groups:
            group.shard.grad = None
        self.gather_updated()

    def held_tensors(self) -> list:
        return super().held_tensors() + [t for g in self.groups for t in (g.flat, g.grad_shard)]
