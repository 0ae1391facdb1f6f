"""``bucketed``: after backward, gradients are packed into buckets and each bucket is all-reduced once.

Same result as ``naive``, fewer messages: the latency is paid once per bucket instead of once per
parameter (``dpteach/replica/buckets.py`` explains how buckets are formed). Communication still starts
only after backward has finished - hiding it is the next step, ``overlap.py``.
"""
from ..replica.buckets import build_buckets
from .base import GradientSync


class BucketedSync(GradientSync):
    name = "bucketed"
    label = "bucketed (float32)"
    takes_all_reduce = ("ring", "tree")

    def __init__(self, model, timeline, bucket_mb=1.0, first_bucket_mb=None, **options):
        super().__init__(model, timeline, **options)
        self.buckets = build_buckets(model, bucket_mb, first_bucket_mb)

    def held_tensors(self) -> list:
        return super().held_tensors() + [b.buffer for b in self.buckets]  # a second copy of the gradients

    def finish(self, step: int) -> None:
        for bucket in self.buckets:
            with self.overhead(step, "pack"):  # a copy into the flat buffer, not communication
                bucket.copy_in()
            with self.comm.exchange(bucket=bucket.index):
                self.all_reduce_mean(bucket.buffer)
            with self.overhead(step, "unpack"):
                bucket.copy_out()
