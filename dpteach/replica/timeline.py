"""What each rank did, and when: spans for forward, backward, each bucket's communication, optimizer.

A span is a plain dict ``{"step", "name", "lane", "start", "end", ...}`` with times in seconds from
the moment the ranks left a common barrier, so the lanes of different ranks line up. ``lane`` is
``"compute"`` or ``"comm"``: communication that overlaps computation shows up as a comm bar drawn
under a compute bar of the same rank (on a GPU: the stream the collective ran on, beside the compute
stream).

*Exposed communication* is measured, not inferred: it is the time a rank's compute stood still
waiting for communication. Every strategy marks it where it happens - a ``wait`` span where it waits
for collectives launched earlier, and ``blocking=True`` on a collective it calls and waits for at
once (:func:`exposed_time`). What else a strategy adds to a step (packing buckets, casting, launching,
compute slowed by communication sharing its cores or SMs) is overhead, not communication.

Clocks. On CPU, ``time.perf_counter`` (CLOCK_MONOTONIC on Linux: one clock for all processes of a
machine). On a GPU, work is queued and runs later, so host clocks would measure the queueing; there
CUDA events are recorded on the stream and converted to seconds at the end of each step.
"""
from __future__ import annotations

import time
from contextlib import contextmanager

import torch
import torch.distributed as dist

COLORS = {"forward": "#4C72B0", "backward": "#55A868", "optimizer": "#8172B2", "wait": "#C44E52",
          "comm": "#DD8452", "data": "#937860", "compress": "#DA8BC3", "idle": "#CCCCCC",
          "all_gather": "#CCB974", "reduce_scatter": "#64B5CD", "pack": "#8C8C8C", "unpack": "#B0B0B0",
          "decompress": "#E8B5D8"}


class Timeline:
    """Records spans for one rank. ``span(...)`` times a block; ``add(...)`` stores a measured one."""

    def __init__(self, device: torch.device | str = "cpu", enabled: bool = True):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.enabled = enabled
        self.spans: list[dict] = []
        self._pending: list[tuple] = []  # CUDA: (span, start_event, end_event) not yet resolved
        self.restart()

    def restart(self) -> None:
        """Make 'now' the origin (on every rank, together: see :func:`start_together`)."""
        if self.cuda:  # let queued GPU work finish, so the host clock and the GPU's events start together
            torch.cuda.synchronize(self.device)
        self.origin = time.perf_counter()
        if self.cuda:
            self.origin_event = torch.cuda.Event(enable_timing=True)
            self.origin_event.record()

    def now(self) -> float:
        return time.perf_counter() - self.origin

    def event(self):
        """A point in time: a float on CPU, a recorded CUDA event on GPU."""
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return self.now()

    def add(self, step: int, name: str, start, end, lane: str = "compute", **info) -> None:
        if not self.enabled:
            return
        span = {"step": step, "name": name, "lane": lane, **info}
        if self.cuda and not isinstance(start, float):
            self._pending.append((span, start, end))
        else:
            span["start"], span["end"] = start, max(start, end)  # a wait that ended before it began lasted 0 s
        self.spans.append(span)

    @contextmanager
    def span(self, step: int, name: str, lane: str = "compute", **info):
        start = self.event()
        yield
        self.add(step, name, start, self.event(), lane, **info)

    def resolve(self) -> None:
        """Turn pending CUDA events into seconds (after the step's work has been synchronised)."""
        if self._pending:
            torch.cuda.synchronize(self.device)
        for span, start, end in self._pending:
            span["start"] = self.origin_event.elapsed_time(start) / 1e3
            span["end"] = max(span["start"], self.origin_event.elapsed_time(end) / 1e3)
        self._pending.clear()


def start_together(*timelines: Timeline) -> None:
    """Start the clocks of every rank at one moment: this rank's device idle, then a barrier, then origin.

    The order matters on a GPU. A rank's host reaches the barrier while its GPU may still be busy with
    queued work (the model's set-up, a broadcast). Synchronising *after* the barrier would start each
    rank's clock once its own queue drained - at different moments on different ranks, so their lanes
    would not line up. Synchronising first makes every rank arrive at the barrier idle; all leave it
    together and take 'now' as zero.
    """
    for device in {t.device for t in timelines if t.cuda}:
        torch.cuda.synchronize(device)
    dist.barrier()
    for timeline in timelines:
        timeline.restart()


def union_time(intervals) -> float:
    """Total time covered by ``(start, end)`` intervals, overlapping ones counted once."""
    total, cur_start, cur_end = 0.0, None, None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def busy_time(spans: list[dict], lane: str) -> float:
    """Total time covered by the spans of one lane (overlapping spans counted once)."""
    return union_time((s["start"], s["end"]) for s in spans if s["lane"] == lane)


def is_waiting(span: dict) -> bool:
    """Whether ``span`` is time this rank's compute spent waiting for communication (see the module note)."""
    return span["name"] == "wait" or bool(span.get("blocking"))


def exposed_time(spans: list[dict]) -> float:
    """The exposed communication in ``spans`` (one step's, usually): the time covered by waiting spans."""
    return union_time((s["start"], s["end"]) for s in spans if is_waiting(s))


def step_accounting(spans: list[dict], steps) -> dict:
    """Over ``steps`` (medians of one rank's steps): ``exposed_s``, the communication waited for, and
    ``overhead_s``, the spans a strategy marked as overhead (``overhead=True``: packing, compressing, an outer
    step - ``sync/base.py``'s ``overhead``), added up per name, in the order they first appear."""
    per_step = {s: [] for s in steps}
    for span in spans:
        if span["step"] in per_step:
            per_step[span["step"]].append(span)
    names = list(dict.fromkeys(s["name"] for mine in per_step.values() for s in mine if s.get("overhead")))

    def median(values):
        values = sorted(values)
        return values[len(values) // 2] if values else 0.0
    return {"exposed_s": median(exposed_time(mine) for mine in per_step.values()),
            "overhead_s": {name: median(sum(s["end"] - s["start"] for s in mine if s["name"] == name)
                                        for mine in per_step.values())
                           for name in names}}
