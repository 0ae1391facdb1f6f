"""Per rank and step: where the time went, and which collectives ran - read from the profiler's own events.

Each ``ProfilerStep#N`` span is one step. Inside it (times in microseconds, as the trace has them):

* **compute**: on a GPU, the kernels that are not NCCL's; on a CPU rank, the operators the training thread
  ran (``aten::...``, autograd's ``evaluate_function``, the optimizer), minus data loading and the short
  calls that only hand a collective to the backend (``c10d::...``).
* **data**: the training thread inside ``enumerate(DataLoader)#...__next__``, which torch.profiler records
  around every batch a DataLoader hands out (lesson 08).
* **communication**: the collectives as they ran - NCCL's kernels on a GPU; on CPU, gloo's ``gloo:all_reduce``
  (and the like) spans, recorded on the gloo thread that worked on them, from the moment it picked the work up
  to the moment it ended (so a collective's span includes the time it waited for the slowest rank).
* **exposed communication**: communication while the rank computed nothing and loaded nothing - the part
  of it that overlap did not hide (lesson 04). **Idle**: neither.

Each collective's payload is its tensor's elements (``Input Dims``) times its element size (``Input type``),
as the profiler recorded them with ``record_shapes=True``; its launch is the matching ``c10d::`` call on the
thread that issued it, so "launched during backward" can be told from "launched after it" (DDP launches a
bucket as soon as its last gradient is ready: reducer.cpp, ``mark_bucket_ready``).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from .traces import RankTrace, STEP_PREFIX

DATA_PREFIX = "enumerate(DataLoader)"
BACKWARD_PREFIX = "autograd::engine::evaluate_function"
ELEMENT_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "int": 4, "long int": 8,
                 "long": 8, "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1,
                 "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1}
FLOAT_TYPES = ("float", "double", "c10::Half", "c10::BFloat16")


# -- intervals: lists of (start, end), sorted and disjoint once merged ------------------------------------
def union(intervals) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        elif end > start:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def total(intervals) -> float:
    return sum(b - a for a, b in union(intervals))


def minus(intervals, holes) -> list[tuple[float, float]]:
    """The parts of ``intervals`` outside every hole."""
    holes, out = union(holes), []
    for start, end in union(intervals):
        cursor = start
        for a, b in holes:
            if b <= cursor or a >= end:
                continue
            if a > cursor:
                out.append((cursor, a))
            cursor = max(cursor, b)
        if cursor < end:
            out.append((cursor, end))
    return out


def clip(intervals, start, end) -> list[tuple[float, float]]:
    return [(max(a, start), min(b, end)) for a, b in intervals if b > start and a < end]


def _span(e) -> tuple[float, float]:
    return float(e["ts"]), float(e["ts"]) + float(e["dur"])


# -- collectives ---------------------------------------------------------------------------------------------
@dataclass
class Collective:
    kind: str         # all_reduce, all_gather, reduce_scatter, broadcast, ...
    dtype: str        # as the profiler names it: float, int, c10::BFloat16, ...
    elements: int
    bytes: int
    start: float      # when it ran (the backend's span or the kernel)
    end: float
    launch: float     # when the training side handed it over

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_TYPES


def element_count(dims) -> int:
    if not dims:
        return 0
    first = dims[0]
    if first and isinstance(first[0], list):  # a TensorList: [[n], [m]]
        return sum(math.prod(d) for d in first)
    return math.prod(first) if first else 0


def _dtype(types) -> str:
    return str(types[0]) if types else "?"


def collectives(trace: RankTrace) -> list[Collective]:
    """The rank's collectives in the order they ran, with payload and launch time."""
    launches = [float(e["ts"]) for e in trace.events if str(e.get("name", "")).startswith("c10d::")
                and e.get("cat") == "cpu_op"]
    found = []
    if trace.gpu:
        kernels = [e for e in trace.events if e.get("cat") == "kernel" and "nccl" in e.get("name", "").lower()]
        calls = [e for e in trace.events if e.get("cat") != "kernel" and str(e.get("name", "")).startswith("nccl:")]
        for i, kernel in enumerate(kernels):
            call = calls[i] if i < len(calls) else {}
            args = call.get("args", {})
            dtype, elements = _dtype(args.get("Input type")), element_count(args.get("Input Dims"))
            kind = str(call.get("name", "nccl:?")).split(":", 1)[1]
            start, end = _span(kernel)
            found.append(Collective(kind, dtype, elements, elements * ELEMENT_BYTES.get(dtype, 4), start, end,
                                    float(call.get("ts", start))))
    else:
        spans = [e for e in trace.events if str(e.get("name", "")).startswith("gloo:")]
        for i, e in enumerate(spans):
            args = e.get("args", {})
            dtype, elements = _dtype(args.get("Input type")), element_count(args.get("Input Dims"))
            start, end = _span(e)
            launch = launches[i] if len(launches) == len(spans) else start
            found.append(Collective(e["name"].split(":", 1)[1], dtype, elements,
                                    elements * ELEMENT_BYTES.get(dtype, 4), start, end, launch))
    return found


# -- one step of one rank ------------------------------------------------------------------------------------
@dataclass
class StepMeasure:
    step: int
    start: float
    end: float
    compute: float
    data: float
    comm: float
    exposed_comm: float
    idle: float
    backward_end: float | None
    collectives: list = field(repr=False)

    @property
    def duration(self) -> float:
        return self.end - self.start


def measure_steps(trace: RankTrace) -> list[StepMeasure]:
    pid, tid = trace.main_thread
    on_main = [e for e in trace.events if (e["pid"], e["tid"]) == (pid, tid)]
    data = [_span(e) for e in on_main if str(e.get("name", "")).startswith(DATA_PREFIX)]
    if trace.gpu:
        work = [_span(e) for e in trace.events if e.get("cat") == "kernel" and "nccl" not in e["name"].lower()]
    else:
        work = [_span(e) for e in on_main if not str(e.get("name", "")).startswith((STEP_PREFIX, DATA_PREFIX, "c10d::"))]
    compute_all = minus(work, data)
    backward = [_span(e) for e in trace.events if str(e.get("name", "")).startswith(BACKWARD_PREFIX)]
    every = collectives(trace)
    out = []
    for index, step in enumerate(trace.steps):
        a, b = _span(step)
        mine = [c for c in every if a <= c.launch < b]
        comm = clip([(c.start, c.end) for c in mine], a, b)
        busy = clip(compute_all, a, b) + clip(data, a, b)
        ends = [e for s, e in backward if a <= s < b]
        out.append(StepMeasure(
            step=index, start=a, end=b, compute=total(clip(compute_all, a, b)), data=total(clip(data, a, b)),
            comm=total(comm), exposed_comm=total(minus(comm, busy)), idle=(b - a) - total(busy + comm),
            backward_end=max(ends) if ends else None, collectives=mine))
    return out


def median(values, default=0.0) -> float:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else default
