"""FSDP2's collectives of one step, read from the ranges it records for the profiler.

``zero3`` draws its own all-gathers on the timeline because the course wrote them. FSDP2 keeps
its collectives inside ``fully_shard``, where no hook reaches; what it does offer is a
``torch.profiler.record_function`` range around each phase (``torch/distributed/fsdp/_fully_shard/``:
``FSDP::pre_forward (net.2)``, ``FSDP::all_gather (net.2)``, ``FSDP::backward_prefetch for net.0``,
``FSDP::post_backward_reduce (net.2)``, ... with the layer's module name). gloo records the
collectives themselves on its worker threads (``gloo:all_gather``, ``gloo:all_reduce``).
:func:`profile_step` profiles one training step on this rank and :func:`fsdp_spans` turns those
ranges into spans of the course's timeline:

* an **all-gather** span per ``gloo:all_gather``, from its start to its end on gloo's thread, named
  after the layer whose ``FSDP::all_gather (...)`` range encloses it, and counted as *prefetched* when that
  range runs inside ``FSDP::forward_prefetch`` or ``FSDP::backward_prefetch`` (issued before the
  layer asked for it) and *on demand* otherwise;
* a **reduce-scatter** span per layer's ``FSDP::post_backward_reduce (...)`` range. On gloo the
  reduce-scatter of a flat tensor is an all-reduce followed by a copy of this rank's chunk (the
  profile shows ``gloo:all_reduce`` inside it): the same result, for about twice the bytes of a
  ring reduce-scatter.

What the profile says about prefetching on a CPU, measured rather than assumed: in **backward**
FSDP2 prefetches explicitly, one layer ahead; in **forward** its prefetching is *implicit* - the
all-gather goes to a separate CUDA stream and the CPU runs ahead to the next layer - so on CPU
tensors, where there are no streams, every forward all-gather is issued by its own layer and waited
for at once (``FSDPCommContext.get_all_gather_streams``; explicit forward prefetching is
``set_modules_to_forward_prefetch``).

The range names are FSDP2's internals, not an API: a torch that renames them gets a clear error here.
"""
from __future__ import annotations

import os
import re
import sys
import time
from contextlib import contextmanager

import torch

LAYER = re.compile(r"^FSDP::(all_gather|post_backward_reduce) \((.+)\)$")  # (the layer's module name)
PREFETCH = ("FSDP::forward_prefetch", "FSDP::backward_prefetch")


@contextmanager
def native_output_silenced():
    """Send what native code writes to this process's stdout and stderr to /dev/null for the block.

    The profiler's C++ side (Kineto) prints a line of its own when it starts and stops ("USDT: ...
    profiler_start"), whatever ``KINETO_LOG_LEVEL`` says; in a lesson those lines land in the learner's
    cell. Python's own streams are flushed first, so nothing of theirs is lost."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            os.close(fd)


def profile_step(run_step, timeline) -> tuple[list, float]:
    """Run ``run_step()`` under the CPU profiler; return its events and the offset (seconds) that maps
    a profiler time (microseconds since the trace started) onto ``timeline``: ``offset + us / 1e6``."""
    with native_output_silenced():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
            wall_ns, on_timeline = time.time_ns(), timeline.now()  # one moment on both clocks
            run_step()
        trace_start_ns = profiler.profiler.kineto_results.trace_start_ns()  # wall-clock time of the trace's zero
        events = list(profiler.events())
    return events, on_timeline - (wall_ns - trace_start_ns) / 1e9


def _inside(inner, outer) -> bool:
    return outer.time_range.start <= inner.time_range.start and inner.time_range.end <= outer.time_range.end


def fsdp_spans(events, step: int, offset: float) -> tuple[list[dict], dict]:
    """Timeline spans (lane "comm") of FSDP2's collectives in ``events``, and
    ``{"prefetched", "on_demand"}``: the all-gathers issued ahead of their layer, and the others."""
    ranges = [e for e in events if LAYER.match(e.name)]
    if not ranges:
        raise RuntimeError(f"the profile holds no FSDP::all_gather ranges: this torch ({torch.__version__}) "
                           f"names FSDP2's ranges differently, so its collectives cannot be read from a profile")
    prefetches = [e for e in events if e.name.startswith(PREFETCH)]
    gloo = [e for e in events if e.name == "gloo:all_gather"]
    at = lambda us: offset + us / 1e6  # noqa: E731 - profiler microseconds to timeline seconds
    spans, counts = [], {"prefetched": 0, "on_demand": 0}
    for outer in sorted(ranges, key=lambda e: e.time_range.start):
        kind, layer = LAYER.match(outer.name).groups()
        if kind == "all_gather":
            inner = [g for g in gloo if _inside(g, outer)]
            ahead = any(_inside(outer, p) for p in prefetches)
            counts["prefetched" if ahead else "on_demand"] += 1
            for g in inner or [outer]:  # gloo's own span where the profile has it
                spans.append({"step": step, "name": "all_gather", "lane": "comm", "layer": layer,
                              "prefetched": ahead, "start": at(g.time_range.start), "end": at(g.time_range.end)})
        else:
            spans.append({"step": step, "name": "reduce_scatter", "lane": "comm", "layer": layer,
                          "start": at(outer.time_range.start), "end": at(outer.time_range.end)})
    return spans, counts
