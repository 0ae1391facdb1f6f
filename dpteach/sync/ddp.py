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
so DDP's timeline can be drawn next to ours. DDP waits for its buckets inside backward, where no
caller can time the wait; but the wait is exactly the time from the last gradient computed (noted by
a hook on every parameter) to the last bucket's all-reduce finished, so that is the ``wait`` span
``finish`` records: the exposed communication, measured as for every other strategy. With ``grad_comm="bf16"`` (or ``"fp16"``) the hook
does what torch's ``bf16_compress_hook`` (``fp16_compress_hook``) does, in
``torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py``: cast the fp32 bucket to 16 bits,
divide by W, all-reduce the 16-bit copy (half the bytes), and copy the result back into the fp32
bucket. The sum of W gradients is then rounded to 8 (bf16) or 11 (fp16) significant bits. (DDP itself
refuses a hook named ``bf16_compress_hook`` unless torch was *built* with CUDA (or HIP) and NCCL 2.10 or
later, or runs on XPU with XCCL - ``_check_comm_hook`` in ``torch/nn/parallel/distributed.py`` checks
the build, not where the job runs: a gloo job on CPU tensors passes on a CUDA wheel and fails on a
CPU-only one. This hook, being our own, runs on every build.)
"""
from contextlib import contextmanager

from torch.nn.parallel import DistributedDataParallel

from ..ranks import context
from ..replica.precision import PRECISIONS
from .base import GradientSync


def wrap_ddp(module, **options) -> DistributedDataParallel:
    """``module`` on this rank's device inside ``DistributedDataParallel`` (``device_ids`` only on CUDA)."""
    device = context.device()
    return DistributedDataParallel(module.to(device), device_ids=[device] if device.type == "cuda" else None,
                                   **options)


class TorchDDP(GradientSync):
    name = "ddp"
    label = "ddp (replicated)"
    takes_grad_comm = True

    def __init__(self, model, timeline, bucket_mb=1.0, first_bucket_mb=None, grad_comm="fp32", **options):
        super().__init__(model, timeline, **options)
        self.ddp = wrap_ddp(model, bucket_cap_mb=bucket_mb, process_group=self.comm.group)
        self.wire_dtype = PRECISIONS[grad_comm]
        self.ddp.register_comm_hook(*self.comm_hook())
        self.last_ready = self.last_done = None  # this step: the last gradient computed, the last bucket sent
        self.handles = [p.register_post_accumulate_grad_hook(self._gradient_ready) for p in self.params]

    def comm_hook(self) -> tuple:
        """The (state, hook) DDP calls for every bucket: ours, which times each bucket's all-reduce."""
        return None, self._timed_allreduce

    def _gradient_ready(self, param) -> None:
        if self.will_sync:
            self.last_ready = self.timeline.event()

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
        bucket_buffer = bucket.buffer()
        start, step, index = self.timeline.event(), self.step, bucket.index()
        tensor = bucket_buffer.to(self.wire_dtype)  # a 16-bit copy, or the fp32 bucket itself
        work = self.all_reduce_mean(tensor, async_op=True)  # bytes counted at the size that travels

        def done(fut):
            end = self.timeline.event()
            # on CPU the latest of the host times; on a GPU an event, and NCCL's buckets finish in launch order
            later = isinstance(end, float) and isinstance(self.last_done, float) and self.last_done > end
            self.last_done = self.last_done if later else end
            self.timeline.add(step, "comm", start, end, lane="comm", bucket=index)
            return bucket_buffer.copy_(fut.value()[0]) if tensor is not bucket_buffer else fut.value()[0]
        return work.get_future().then(done)

    def finish(self, step: int) -> None:
        # DDP has already averaged the gradients inside backward; what it waited for there:
        if self.last_ready is not None and self.last_done is not None:
            self.timeline.add(step, "wait", self.last_ready, self.last_done)
        self.last_ready = self.last_done = None
