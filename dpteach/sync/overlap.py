"""``overlap``: each bucket's all-reduce starts while backward is still computing earlier layers.

This is the answer to the course's central question. Backward runs from the last layer to the
first; buckets are filled in that same reverse order (``dpteach/replica/buckets.py``). As soon as every
gradient of a bucket is ready, the bucket's all-reduce is launched *asynchronously* and backward
carries on with the layers before it - computation and communication run at the same time. Only
what is still in flight when backward ends is exposed. The arithmetic is the same sum of the same
gradients, so the result equals single-process training.

How it is wired, step by step:

1. For every parameter we register ``register_post_accumulate_grad_hook``. It fires once per
   backward, after the gradient has been accumulated into ``param.grad``, and it receives the
   *parameter*, not the gradient: the gradient is ``param.grad``.
2. The hook copies ``param.grad`` into the bucket's flat buffer. When the bucket's last gradient
   arrives, the bucket is ready.
3. Buckets are launched strictly in bucket order, 0, 1, 2, ...: a ready bucket waits for every
   earlier bucket to be launched. Collectives are matched by launch order, so if rank 0 launched
   bucket 2 first and rank 1 bucket 1 first, they would be adding up different tensors (gloo)
   or deadlock (NCCL). DDP enforces the same rule.
4. ``finish`` launches any bucket that never became ready (a parameter that got no gradient this
   step contributes zeros, the same on every rank, so nothing hangs), then waits for every
   all-reduce and copies the averages back into ``.grad``. Only then may the optimizer step.
5. With gradient accumulation the hooks still fire on every micro-batch, but they do nothing
   unless the micro-batch was declared the syncing one *before* its forward (``micro_batch``).
6. Reverse definition order is only a guess at the order backward produces gradients: in a
   transformer a block's first LayerNorm gets its gradient after the attention below it, so a
   bucket cut in reverse order can wait half of backward for one small tensor. As DDP's Reducer
   does (lesson 03), the first step records the order in which gradients really became ready, and
   from the second step on the buckets are cut in that order, with the same caps. Every rank uses
   rank 0's order (one broadcast, once), so every rank launches the same buckets in the same order.
"""
from __future__ import annotations

import torch

from ..replica.buckets import Bucket, assign_buckets, build_buckets
from .base import GradientSync, ReadyCount


class OverlapSync(GradientSync):
    name = "overlap"

    def __init__(self, model, timeline, bucket_mb=1.0, first_bucket_mb=None, **options):
        super().__init__(model, timeline, **options)
        self.caps = (bucket_mb, first_bucket_mb)
        self._use_buckets(build_buckets(model, bucket_mb, first_bucket_mb))
        self.ready_order = []  # the parameters, in the order their gradients became ready (first step)
        self.rebuilt = False
        self.hook_calls = 0
        self.handles = [p.register_post_accumulate_grad_hook(self._on_gradient_ready) for p in self.params]
        self._reset()

    def _use_buckets(self, buckets) -> None:
        self.buckets = buckets
        self.ready = ReadyCount(buckets)  # gradients each bucket still waits for
        self.where = {}  # parameter -> (bucket, position inside the bucket)
        for bucket in self.buckets:
            for position, p in enumerate(bucket.params):
                self.where[p] = (bucket, position)

    def _reset(self) -> None:
        self.ready.reset()
        self.next_to_launch = 0
        self.in_flight = []  # (bucket, work) in launch order

    def start_step(self, step: int) -> None:
        super().start_step(step)
        self._reset()

    def _on_gradient_ready(self, param) -> None:
        self.hook_calls += 1
        if not self.will_sync:  # an accumulation micro-batch: the gradient just stays in param.grad
            return
        if not self.rebuilt:
            self.ready_order.append(param)
        bucket, position = self.where[param]
        bucket.copy_in(position)
        self.ready.arrived(bucket)
        self._launch_ready_buckets()

    def _launch_ready_buckets(self, force: bool = False) -> None:
        while self.next_to_launch < len(self.buckets):
            bucket = self.buckets[self.next_to_launch]
            if not self.ready.complete(bucket) and not force:
                return  # an earlier bucket is not ready yet: later ones must wait their turn
            if not self.ready.complete(bucket):  # forced: some parameters got no gradient this step
                for position, p in enumerate(bucket.params):
                    if p.grad is None:
                        bucket.views[position].zero_()
            start = self.timeline.event()
            work = self.all_reduce_mean(bucket.buffer, async_op=True)
            self.in_flight.append((bucket, work))
            self._note_completion(bucket, work, start)
            self.next_to_launch += 1

    def _note_completion(self, bucket, work, start) -> None:
        step, timeline = self.step, self.timeline

        def done(fut):  # runs on the communication thread the moment the all-reduce completes
            timeline.add(step, "comm", start, timeline.event(), lane="comm", bucket=bucket.index)
            return fut.value()
        work.get_future().then(done)

    def held_tensors(self) -> list:
        return super().held_tensors() + [b.buffer for b in self.buckets]  # a second copy of the gradients

    def finish(self, step: int) -> None:
        self._launch_ready_buckets(force=True)
        with self.comm.waiting():
            for _, work in self.in_flight:
                work.wait()
        with self.overhead(step, "unpack"):  # the averages back into .grad, not communication
            for bucket, _ in self.in_flight:
                bucket.copy_out()
        if not self.rebuilt:
            self._rebuild_in_ready_order()

    def _rebuild_in_ready_order(self) -> None:
        """Cut the buckets again in the order this step's gradients became ready (rank 0's order)."""
        index = {p: i for i, p in enumerate(self.params)}
        seen = [index[p] for p in self.ready_order]
        order = torch.tensor(seen + [i for i in range(len(self.params)) if i not in set(seen)])
        self.comm.broadcast(order, src=0)  # every rank must launch the same buckets in the same order
        ready = [self.params[i] for i in order.tolist()]
        groups = assign_buckets(ready[::-1], *self.caps)  # assign_buckets fills from the end of its list
        self._use_buckets([Bucket.build(b, [ready[::-1][i] for i in group]) for b, group in enumerate(groups)])
        self.rebuilt = True
