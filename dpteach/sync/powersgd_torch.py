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
"""
from __future__ import annotations

from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook

from .ddp import TorchDDP
from .powersgd import PowerSGD, check_knobs, worth_compressing


class TorchPowerSGD(TorchDDP):
    name = "powersgd_torch"
    label = "powersgd_torch (DDP + torch's powerSGD_hook)"
    colour = "#CCB974"
    exact = False
    takes_grad_comm = False
    emulates_link = False  # torch's hook calls dist.all_reduce itself: no message passes through the course's link
    emulates_peers = False
    knobs = PowerSGD.knobs
    main_knob = PowerSGD.main_knob
    steady_from = PowerSGD.steady_from

    @classmethod
    def check(cls, config, world_size: int) -> None:
        super().check(config, world_size)
        check_knobs(config)
        if config.powersgd_start < 2:  # PowerSGDState.__init__ refuses it with warm start or error feedback on
            raise ValueError(f"powersgd_start={config.powersgd_start!r} is not allowed with strategy="
                             f"'powersgd_torch': torch's PowerSGDState needs at least 2 plain steps first (DDP "
                             f"rebuilds its buckets after the first); use 2 or more")

    def __init__(self, model, timeline, powersgd_rank: int = 4, powersgd_start: int = 10,
                 powersgd_error_feedback: bool = True, **options):
        self.low_rank, self.start, self.error_feedback = powersgd_rank, powersgd_start, powersgd_error_feedback
        super().__init__(model, timeline, **options)

    def comm_hook(self) -> tuple:
        self.state = PowerSGDState(process_group=self.comm.group, matrix_approximation_rank=self.low_rank,
                                   start_powerSGD_iter=self.start, use_error_feedback=self.error_feedback)
        return self.state, self._counted_powersgd

    def _counted_powersgd(self, state, bucket):
        start, step, index = self.timeline.event(), self.step, bucket.index()
        for nbytes in self._all_reduces(state, bucket):  # read before the hook: it advances state.iter
            self.comm.count("all_reduce", nbytes)
        future = powerSGD_hook(state, bucket)

        def done(fut):
            end = self.timeline.event()
            self.last_done = end
            self.timeline.add(step, "comm", start, end, lane="comm", bucket=index)
            return fut.value()
        return future.then(done)

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
