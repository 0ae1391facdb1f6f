"""``powersgd_torch``: DDP with torch's own ``powerSGD_hook`` - the reference ``powersgd.py`` is held to.

As ``ddp`` is torch's DistributedDataParallel beside the course's ``overlap``, this is DDP with the
communication hook torch ships for PowerSGD (``torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py``),
configured by the same knobs as the course's ``powersgd``::

    state = PowerSGDState(process_group, matrix_approximation_rank=powersgd_rank,
                          start_powerSGD_iter=powersgd_start, use_error_feedback=powersgd_error_feedback)
    ddp.register_comm_hook(state, powerSGD_hook)

DDP calls the hook once per bucket with the bucket's flat gradients; for the first ``start_powerSGD_iter``
steps the hook all-reduces the bucket as it is, then it compresses (``powersgd.py`` walks through what it
does). torch refuses ``start_powerSGD_iter`` below 2 while error feedback or warm start is on: DDP rebuilds
its buckets after the first step, and the hook's memories are kept per bucket.

What this file adds is measurement, as ``ddp.py`` does for plain DDP: the hook is wrapped so that each
bucket's exchange is drawn on the timeline, and its bytes are counted as the ring would put them on the
wire - one all-reduce of the bucket before the start, afterwards one of the tensors left whole and one
each of all P and all Q (``_should_compress`` decides which tensors are compressed: ``powersgd.py``'s
``worth_compressing``). The hook calls ``dist.all_reduce`` itself, so no emulated link reaches it (as
FSDP2): its step time is this machine's own transfers.

One change to how DDP drives the hook: each bucket's hook starts only after the previous bucket's has
finished. The hook launches a bucket's second all-reduce (Q) from a callback on the first one's future,
while autograd may already be launching the next bucket's first all-reduce; with more than one bucket the
ranks can then launch the two in different orders, and a backend that matches collectives by launch order
pairs the wrong messages (gloo aborts: "Received data size doesn't match expected size"; torch's own parity
test of this hook is skipped on gloo, pytorch/pytorch#58467). Waiting costs the overlap between buckets and
changes no number.
"""
from __future__ import annotations

from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook

from .ddp import TorchDDP
from dataclasses import replace

from .powersgd import ERROR_FEEDBACK, RANK, START, PowerSGD, refuse_fp16, worth_compressing


class TorchPowerSGD(TorchDDP):
    name = "powersgd_torch"
    label = "powersgd_torch (DDP + torch's powerSGD_hook)"
    colour = "#CCB974"
    exact = False
    takes_grad_comm = False
    emulates_link = False  # torch's hook calls dist.all_reduce itself: no message passes through the course's link
    emulates_peers = False
    # PowerSGDState.__init__ refuses a start below 2 with warm start or error feedback on
    knobs = (RANK, replace(START, low=2, why="torch's PowerSGDState needs at least 2 plain steps first: DDP "
                                               "rebuilds its buckets after the first"), ERROR_FEEDBACK)
    main_knob = PowerSGD.main_knob
    steady_from = PowerSGD.steady_from

    @classmethod
    def check(cls, config, world_size: int) -> None:
        super().check(config, world_size)
        refuse_fp16(config)

    def __init__(self, model, timeline, powersgd_rank: int, powersgd_start: int, powersgd_error_feedback: bool,
                 **options):
        self.low_rank, self.start, self.error_feedback = powersgd_rank, powersgd_start, powersgd_error_feedback
        self.previous = None  # the last bucket's future
        super().__init__(model, timeline, **options)

    def comm_hook(self) -> tuple:
        self.state = PowerSGDState(process_group=self.comm.group, matrix_approximation_rank=self.low_rank,
                                   start_powerSGD_iter=self.start, use_error_feedback=self.error_feedback)
        return self.state, self._counted_powersgd

    def _counted_powersgd(self, state, bucket):
        start, step, index = self.timeline.event(), self.step, bucket.index()
        for nbytes in self._all_reduces(state, bucket):  # read before the hook: it advances state.iter
            self.comm.count("all_reduce", nbytes)
        if self.previous is not None:  # one bucket at a time: see the module note
            self.previous.wait()
        future = powerSGD_hook(state, bucket)

        def done(fut):
            end = self.timeline.event()
            self.last_done = end
            self.timeline.add(step, "comm", start, end, lane="comm", bucket=index)
            return fut.value()
        self.previous = future.then(done)
        return self.previous

    def _all_reduces(self, state, bucket) -> list[int]:
        """The bytes of each all-reduce the hook is about to run for ``bucket``."""
        if state.iter < state.start_powerSGD_iter:
            return [bucket.buffer().numel() * bucket.buffer().element_size()]
        whole, low_rank_p, low_rank_q = 0, 0, 0
        for grad in bucket.gradients():
            n = grad.shape[0]
            m = grad.numel() // n
            if worth_compressing(n, m, self.low_rank):
                low_rank_p += n * self.low_rank * grad.element_size()
                low_rank_q += m * self.low_rank * grad.element_size()
            else:
                whole += grad.numel() * grad.element_size()
        return [nbytes for nbytes in (whole, low_rank_p, low_rank_q) if nbytes]
