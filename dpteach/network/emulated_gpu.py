"""The emulated link on a GPU: each collective's link time is spent on a CUDA stream, on the GPU's clock.

Why not the host clock, as on CPU ranks (``emulated.py``)? A GPU rank's host runs ahead of its GPU: autograd
*enqueues* backward's kernels and a bucket's all-reduce long before the GPU runs them. A deadline taken
from the host clock would start the link's time when the host enqueued a bucket, not when the GPU had
computed it, and overlap would look better than it is. So here the link is a stream of its own:

    launch a collective of cost c (alpha-beta, ``costmodel.collective_time``):
      link stream waits for the caller's stream        # the gradients exist on the GPU from here
      the real collective starts (NCCL's own stream waits for the caller's stream too)
      on the link stream: spin for c seconds           # torch.cuda._sleep: one thread block, no memory traffic
      on the link stream: wait for the real collective
      the caller's completion = the link stream's position here

Messages queue on the link stream one after another, as on a real link; the time a message took is
max(its link time, the real transfer), as on CPU ranks. ``torch.cuda._sleep`` counts clock cycles,
and a GPU's clock moves with its load (an H200 idles at a fraction of its boost clock), so the cycles
per second are measured at the start and measured again on every message the link carried: each
message's spin is timed with CUDA events once it has run, and the rate follows what it finds. The
report says how far the spins were from the link's times (``emulation_error``).

What it leaves out: NCCL's kernels occupy SMs while they move data (lesson 04); a spin occupies one.
"""
from __future__ import annotations

import threading

import torch

from . import costmodel

SLACK_S = 50e-6  # a real transfer finishing this little after the link's time still counts as the link's
CALIBRATION_CYCLES = 20_000_000  # about 10 ms at 2 GHz


def _event() -> torch.cuda.Event:
    e = torch.cuda.Event(enable_timing=True)
    e.record()
    return e


class _StreamWork:
    """A collective on the GPU link: ``wait()`` makes the caller's stream wait for it (the host does not),
    ``get_future()`` is a CUDA-aware future whose callbacks run after it, ``is_completed()`` asks the GPU."""

    def __init__(self, future, done):
        self.future, self.done = future, done

    def wait(self) -> bool:
        self.future.wait()
        return True

    def is_completed(self) -> bool:
        return self.done.query()

    def get_future(self) -> torch.futures.Future:
        return self.future


class StreamLink:
    """This rank's side of an emulated link, on its GPU ``device``, for a world of ``world_size`` ranks."""

    def __init__(self, link, world_size: int, device):
        self.link, self.world, self.device = link, world_size, torch.device(device)
        self.stream = torch.cuda.Stream(self.device)
        self.messages = self.machine_bound = 0
        self.link_seconds = 0.0
        self.errors: list[float] = []  # |spun - asked| / asked, per message checked
        self._pending: list[tuple] = []  # (seconds asked, start, deadline, done) not checked yet
        self._lock = threading.Lock()  # DDP's hooks may launch from autograd's thread
        self.cycles_per_s = self._calibrate()

    def _calibrate(self) -> float:
        with torch.cuda.stream(self.stream):
            for _ in range(3):  # the clock ramps up under load: keep the last reading
                start = _event()
                torch.cuda._sleep(CALIBRATION_CYCLES)
                end = _event()
                end.synchronize()
                rate = CALIBRATION_CYCLES / (start.elapsed_time(end) / 1e3)
        return rate

    def launch(self, kind: str, nbytes: int, start_real, async_op: bool, algorithm: str = "ring"):
        cost = costmodel.collective_time(kind, nbytes, self.world, self.link, algorithm)
        caller = torch.cuda.current_stream(self.device)
        with self._lock:
            self._check_finished()
            self.stream.wait_stream(caller)
            work = start_real()
            with torch.cuda.stream(self.stream):
                start = _event()
                torch.cuda._sleep(max(1, int(cost * self.cycles_per_s)))
                deadline = _event()
                work.wait()  # NCCL: the link stream waits for NCCL's; one real rank: nothing to wait for
                done = _event()
                future = torch.futures.Future(devices=[self.device])
                future.set_result(work.get_future().value())  # recorded on the link stream: consumers wait for it
            self._pending.append((cost, start, deadline, done))
            self.messages += 1
            self.link_seconds += cost
        if async_op:
            return _StreamWork(future, done)
        caller.wait_stream(self.stream)  # blocking: the caller's stream stalls until the link delivers
        return None

    def _check_finished(self, everything: bool = False) -> None:
        """Time the spins that have run: correct the cycle rate, and count real transfers that ran late."""
        still = []
        for cost, start, deadline, done in self._pending:
            if not (everything or done.query()):
                still.append((cost, start, deadline, done))
                continue
            done.synchronize()
            spun = start.elapsed_time(deadline) / 1e3
            if cost > 0 and spun > 0:
                self.errors.append(abs(spun - cost) / cost)
                self.cycles_per_s *= (cost / spun) ** 0.5  # half-way to what this message found: steady, not jumpy
            self.machine_bound += deadline.elapsed_time(done) / 1e3 > SLACK_S
        self._pending = still

    def report(self) -> dict:
        with self._lock:
            self._check_finished(everything=True)
            share = self.machine_bound / self.messages if self.messages else 0.0
            errors = sorted(self.errors)
            return {**self.link.as_dict(), "messages": self.messages, "machine_bound": self.machine_bound,
                    "machine_bound_share": share, "link_seconds": self.link_seconds,
                    "time_set_by": "machine" if share > 0.5 else "link", "clock": "gpu",
                    "emulation_error": errors[len(errors) // 2] if errors else None}
