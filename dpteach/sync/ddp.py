"""``ddp``: PyTorch's own ``DistributedDataParallel``, the reference the hand-written strategies match.

DDP puts every parameter in one bucket for the first iteration, then rebuilds its buckets in the
order the gradients became ready (for a chain of layers: the reverse of the parameter order),
launches each bucket's all-reduce from autograd hooks while backward runs, in bucket order, and
waits for all of them before backward returns (Li et al., VLDB 2020; lesson 03 reads its buckets).
``bucket_mb`` is passed as ``bucket_cap_mb``, so the first bucket gets the same cap as the others
(DDP's 1 MiB first bucket applies only to its default cap).
For accumulation, ``no_sync()`` wraps the forward *and* backward of every micro-batch but the last.

We install a communication hook that does what DDP's default does - divide the bucket by W and
all-reduce it asynchronously - and also notes when each bucket's all-reduce starts and finishes,
so DDP's timeline can be drawn next to ours.
"""
from contextlib import contextmanager

from torch.nn.parallel import DistributedDataParallel

from .. import context
from .base import GradientSync


def wrap_ddp(module, **options) -> DistributedDataParallel:
    """``module`` on this rank's device inside ``DistributedDataParallel`` (``device_ids`` only on CUDA)."""
    device = context.device()
    return DistributedDataParallel(module.to(device), device_ids=[device] if device.type == "cuda" else None,
                                   **options)


class TorchDDP(GradientSync):
    name = "ddp"

    def __init__(self, model, timeline, bucket_mb=1.0, first_bucket_mb=None, **options):
        super().__init__(model, timeline, **options)
        self.ddp = wrap_ddp(model, bucket_cap_mb=bucket_mb)
        self.ddp.register_comm_hook(None, self._timed_allreduce)

    def wrap(self):
        return self.ddp

    @contextmanager
    def micro_batch(self, sync: bool):
        self.will_sync = sync
        if sync:
            yield
        else:
            with self.ddp.no_sync():
                yield

    def _timed_allreduce(self, state, bucket):
        tensor = bucket.buffer()
        start, step, index = self.timeline.event(), self.step, bucket.index()
        work = self.all_reduce_mean(tensor, async_op=True)

        def done(fut):
            self.timeline.add(step, "comm", start, self.timeline.event(), lane="comm", bucket=index)
            return fut.value()[0]
        return work.get_future().then(done)

    def finish(self, step: int) -> None:
        pass  # DDP has already averaged the gradients inside backward
