"""One trace for the whole job: every rank's trace in one file, one process per rank, for Perfetto or
``chrome://tracing`` (the "one view of all ranks" that torch.profiler's per-rank files do not give; PyTorch
issue 128292 asks for it).

What changes from the per-rank files (Chrome's Trace Event Format, the format they are in):

* ``pid`` becomes the rank, and the process is named ``rank R`` (``process_name`` metadata), sorted by rank;
* each of the rank's threads and GPU streams gets a thread of its own, numbered from 1 and named after what it
  was (``training thread``, ``thread 8203``, ``stream 7``); a trace's own thread names come along;
* clocks: ranks on one host share its clock, so their ``ts`` are kept. Ranks on different hosts do not; there
  each rank is shifted so that the first collective of the first recorded step ends at the same moment on
  every rank, as a collective does (the shift is written in the merged trace's ``dpteachClockOffsetsUs``).
"""
from __future__ import annotations

import json
import os
import tempfile

from .measures import collectives
from .traces import RankTrace, read_traces


def _offsets(traces: list[RankTrace]) -> dict[int, float]:
    if len({t.host for t in traces}) <= 1:
        return {t.rank: 0.0 for t in traces}
    ends = {}
    for t in traces:
        first = next((c for c in collectives(t) if c.launch >= t.steps[0]["ts"]), None)
        ends[t.rank] = first.end if first else None
    if any(v is None for v in ends.values()):
        return {t.rank: 0.0 for t in traces}
    return {r: ends[0] - end for r, end in ends.items()}


def merge_traces(folder: str, out: str | None = None) -> str:
    """Write ``out`` (default ``folder/merged.json``) with every rank of ``folder``; returns its path."""
    traces = read_traces(folder)
    offsets = _offsets(traces)
    events = []
    for trace in traces:
        rank, shift, threads, names = trace.rank, offsets[trace.rank], {}, trace.thread_names

        def thread(pid, tid):
            key = (pid, tid)
            if key not in threads:
                threads[key] = len(threads) + 1
                if key == trace.main_thread:
                    name = "training thread"
                elif isinstance(tid, str) or (isinstance(tid, int) and pid != trace.main_thread[0]):
                    name = names.get(key) or (f"stream {tid}" if isinstance(tid, int) else str(tid))
                else:
                    name = names.get(key) or f"thread {tid}"
                events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": threads[key],
                               "args": {"name": str(name)}})
                events.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": threads[key],
                               "args": {"sort_index": threads[key]}})
            return threads[key]

        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
        thread(*trace.main_thread)
        for e in trace.events:
            merged = dict(e, pid=rank, tid=thread(e.get("pid"), e.get("tid")), ts=float(e["ts"]) + shift)
            events.append(merged)
    document = {"schemaVersion": 1, "displayTimeUnit": "ms",
                "traceEvents": events, "dpteachClockOffsetsUs": {str(r): v for r, v in offsets.items()},
                "dpteachRanks": [{"rank": t.rank, "file": t.file} for t in traces]}
    out = out or os.path.join(folder, "merged.json")
    folder_out = os.path.dirname(os.path.abspath(out))
    os.makedirs(folder_out, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=folder_out, suffix=".partial", delete=False) as f:
        f.write(json.dumps(document, separators=(",", ":")))  # one C-encoded string: json.dump streams in Python
    os.replace(f.name, out)
    return out
