"""An emulated link: every collective runs for real, but finishes no earlier than a chosen network allows.

(The link itself, a value of three costs, and the presets are in ``dpteach.network``; this module is
the emulator that holds each collective to one.)

Why. On a laptop the ranks' "network" is the operating system copying bytes between processes,
and gloo's copies compete with backward for the same 2-4 cores. There, overlap is barely faster
than sending after backward, 8-bit gradients are slower than float32, and a bucket-size sweep never
shows the cost of one huge bucket - the opposite of what a real network shows. A learner can choose
a link instead: the data still moves for real (results stay exact), but each collective completes
only once the link would have delivered it.

How one collective is timed, on every rank, when a strategy launches it::

    cost     = the alpha-beta time of this collective on the link, with the ring algorithms gloo runs
               (all-reduce: 2(W-1) alpha + 2(W-1)/W x n beta; all-gather, reduce-scatter and all-to-all
               of n bytes in all: (W-1) alpha + (W-1)/W x n beta; Thakur, Rabenseifner & Gropp 2005)
    start    = max(when it was launched, when this rank's link becomes free)
    deadline = start + cost         # messages are serialised: a bucket queues behind the ones before it
    done     = max(deadline, when the real collective finished)

The bytes move for real at once, in the caller's order (gloo's own threads carry them, standing in
for a network card), and the caller's completion is then held back until the deadline: a blocking
call sleeps, an asynchronous one's future is completed by this rank's *release thread* when the
deadline comes (or, if the bytes have not arrived by then, when they do). Sleeping costs no CPU,
so backward goes on computing while a bucket is "on the wire" (on GPUs NCCL's kernels do take SMs:
lesson 04). If the real collective finishes *after* its deadline, this machine, not the link, set
that message's time - a link faster than the machine's own transfers cannot be emulated - and
the message is counted as ``machine_bound``; runs report the share, and lessons say so.

A network card moves bytes without the CPU; gloo's threads need it. Each CPU rank therefore runs on
a core of its own (``dpteach.ranks.launcher`` pins it, as a GPU rank owns its GPU): the rank's gloo threads
then preempt its own compute the moment bytes arrive, instead of waking on the peer's core and
stalling the peer. The CPU the real copy takes is still taken from compute, as measured; only the
waiting is free.

What it leaves out: congestion between several links, the skew between ranks (each rank starts its
link clock when *it* launches), and TCP's own dynamics.
``tests/test_link_shaped.py`` holds the emulation against the kernel's own shaping (``tc``) of a
real virtual link.
"""
from __future__ import annotations

import heapq
import threading
import time

import torch

from . import costmodel
from .link import Link

SLACK_S = 200e-6  # a message finishing this little after its deadline still counts as the link's


class _LinkWork:
    """A collective on the link. Blocking: ``wait()`` right after launch. Asynchronous: the release thread
    looks at it at its deadline and completes ``get_future()`` then, or when the bytes arrive if later."""

    def __init__(self, work, deadline: float, emulator: "EmulatedLink", async_op: bool):
        self.work, self.deadline, self.emulator = work, deadline, emulator
        self.future = torch.futures.Future() if async_op else None
        self.arrived_at = None  # when the real transfer finished (asynchronous collectives)
        if async_op:
            # Stamped by the thread that completes the real work, the moment it does: whether the bytes
            # beat the deadline must not depend on when the release thread happens to look (on a loaded
            # machine it can wake late, and a late look would make a late transfer seem on time).
            self.real = torch.futures.Future()  # completed, with the real result, when the bytes are there
            try:
                real = work.get_future()
            except RuntimeError:  # gloo's reduce-scatter has no future ("not implemented"): wait on a thread
                real = None
            if real is not None:
                real.then(self._arrived)
            else:
                threading.Thread(target=self._wait_for_real, name="dpteach-link-wait", daemon=True).start()
            emulator.release_at(deadline, self)

    def _arrived(self, real) -> None:
        self.arrived_at = time.perf_counter()
        try:
            self.real.set_result(real.value())
        except Exception as exc:  # the real collective failed: whoever completes the caller's future says so
            self.real.set_exception(exc)

    def _wait_for_real(self) -> None:
        try:
            self.work.wait()
        except Exception as exc:
            self.arrived_at = time.perf_counter()
            self.real.set_exception(exc)
            return
        self.arrived_at = time.perf_counter()
        self.real.set_result(None)

    def _was_late(self) -> bool:
        return (self.arrived_at or time.perf_counter()) > self.deadline + SLACK_S

    def release(self) -> None:
        """At the deadline, on the release thread: were the bytes there in time?"""
        if self.real.done():  # arrived: complete now, and say whether the link set the time
            self.emulator._finished(late=self._was_late())
            self._complete(self.real)
        else:  # this machine is slower than the link: complete when the real transfer does
            self.real.then(self._late)

    def _late(self, real) -> None:
        self.emulator._finished(late=self._was_late())
        self._complete(real)

    def _complete(self, real) -> None:
        try:
            self.future.set_result(real.value())
        except Exception as exc:  # the real collective failed: the caller hears it
            self.future.set_exception(exc)

    def wait(self) -> bool:
        if self.future is not None:  # asynchronous: the release thread decides when it is done
            self.future.wait()
            return True
        self.work.wait()  # blocking, called right after launch: the clock tells whether it was late
        late = time.perf_counter() > self.deadline + SLACK_S
        self.emulator._finished(late=late)
        remaining = self.deadline - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)  # a sleep: no CPU taken from compute
        return True

    def is_completed(self) -> bool:
        return self.future.done() if self.future is not None else self.work.is_completed()

    def get_future(self) -> torch.futures.Future:
        if self.future is None:
            raise RuntimeError("get_future() needs a collective launched with async_op=True")
        return self.future


class EmulatedLink:
    """This rank's side of an emulated link: when each message may complete, and what set its time."""

    def __init__(self, link: Link, world_size: int):
        self.link, self.world = link, world_size
        self.busy_until = 0.0
        self.messages = 0
        self.machine_bound = 0  # messages whose real transfer finished after the link's deadline
        self.link_seconds = 0.0  # the time the link needed for every message launched
        self._lock = threading.Condition()
        self._due: list = []  # (deadline, sequence, work): asynchronous collectives the release thread completes
        self._sequence = 0
        threading.Thread(target=self._release, name="dpteach-link-release", daemon=True).start()

    def launch(self, kind: str, nbytes: int, start_real, async_op: bool, algorithm: str = "ring"):
        """Start collective ``kind`` for real (``start_real()`` returns its work) and time it on the link."""
        cost = costmodel.collective_time(kind, nbytes, self.world, self.link, algorithm)
        with self._lock:
            self.busy_until = max(time.perf_counter(), self.busy_until) + cost
            self.messages += 1
            self.link_seconds += cost
            deadline = self.busy_until
        work = _LinkWork(start_real(), deadline, self, async_op)
        if async_op:
            return work
        work.wait()
        return None

    def _finished(self, late: bool) -> None:
        with self._lock:
            self.machine_bound += late

    def release_at(self, deadline: float, work: _LinkWork) -> None:
        with self._lock:
            self._sequence += 1
            heapq.heappush(self._due, (deadline, self._sequence, work))
            self._lock.notify()

    def _release(self) -> None:
        while True:
            with self._lock:
                while not self._due or self._due[0][0] > time.perf_counter():
                    self._lock.wait(None if not self._due else self._due[0][0] - time.perf_counter())
                _, _, work = heapq.heappop(self._due)
            work.release()

    def report(self) -> dict:
        with self._lock:
            share = self.machine_bound / self.messages if self.messages else 0.0
            return {**self.link.as_dict(), "messages": self.messages, "machine_bound": self.machine_bound,
                    "machine_bound_share": share, "link_seconds": self.link_seconds,
                    "time_set_by": "machine" if share > 0.5 else "link"}
