"""``overlap``: each bucket's all-reduce starts while backward is still computing earlier layers.

This is the answer to the course's central question. Backward runs from the last layer to the
first; buckets are filled in that same reverse order (``dpteach/buckets.py``). As soon as every
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
"""
from __future__ import annotations

from ..buckets import build_buckets
from .base import GradientSync


class OverlapSync(GradientSync):
    name = "overlap"

    def __init__(self, model, timeline, bucket_mb=1.0, first_bucket_mb=None, **options):
        super().__init__(model, timeline, **options)
        self.buckets = build_buckets(model, bucket_mb, first_bucket_mb)
        self.where = {}  # parameter -> (bucket, position inside the bucket)
        for bucket in self.buckets:
            for position, p in enumerate(bucket.params):
                self.where[p] = (bucket, position)
        self.hook_calls = 0
        self.handles = [p.register_post_accumulate_grad_hook(self._on_gradient_ready) for p in self.params]
        self._reset()

    def _reset(self) -> None:
        self.missing = [len(b.params) for b in self.buckets]  # gradients each bucket still waits for
        self.next_to_launch = 0
        self.in_flight = []  # (bucket, work) in launch order

    def start_step(self, step: int) -> None:
        super().start_step(step)
        self._reset()

    def _on_gradient_ready(self, param) -> None:
        self.hook_calls += 1
        if not self.will_sync:  # an accumulation micro-batch: the gradient just stays in param.grad
            return
        bucket, position = self.where[param]
        bucket.copy_in(position)
        self.missing[bucket.index] -= 1
        self._launch_ready_buckets()

    def _launch_ready_buckets(self, force: bool = False) -> None:
        while self.next_to_launch < len(self.buckets):
            bucket = self.buckets[self.next_to_launch]
            if self.missing[bucket.index] > 0 and not force:
                return  # an earlier bucket is not ready yet: later ones must wait their turn
            if self.missing[bucket.index] > 0:  # forced: some parameters got no gradient this step
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

    def finish(self, step: int) -> None:
        self._launch_ready_buckets(force=True)
        with self.timeline.span(step, "wait"):
            for _, work in self.in_flight:
                work.wait()
        for bucket, _ in self.in_flight:
            bucket.copy_out()

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
