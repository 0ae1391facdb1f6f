"""A run's timelines as a trace file that Perfetto, ``chrome://tracing`` and Holistic Trace Analysis open.

The format is Chrome's Trace Event Format (a JSON object whose ``traceEvents`` list holds the events;
Google's "Trace Event Format" document), the one ``torch.profiler`` exports too. What this module writes:

* one **process per rank** (``pid`` = rank, named ``rank 0``, ``rank 1``, ...), sorted by rank;
* one **thread per stream**: ``compute``, ``communication`` and ``data loading`` (the time a rank waited for
  its next batch, lesson 08) - on GPU ranks ``compute stream`` and ``comm stream``: the stream the collectives
  ran on, NCCL's or the emulated link's. Collectives that
  are in flight at the same time (a bucket launched while the one before it is still on the wire) get a
  thread each - ``communication 2``, ... - because the format draws the events of one thread as a stack,
  and two that overlap without nesting would be drawn wrongly;
* one **complete event** (``"ph": "X"``) per span, named as the lessons name it (``forward``,
  ``backward``, ``comm``, ``wait``, ``all_gather``, ...), with ``ts`` and ``dur`` in microseconds and the
  span's details as ``args``: the step, the run (strategy) it belongs to, a bucket's index, the bytes a
  collective put on this rank's wire, whether the compute stood still for it (``blocking``).

Clocks: every run's spans count from the moment its ranks left a common barrier (``timeline.py``), so
``ts = 0`` is the same moment on every rank. A run that records when its clock started
(``clock_origin_s``, the rank's ``time.perf_counter()`` then) is placed at its real distance from the
first run; without one, runs are laid one after another in the order given.

Open a trace at https://ui.perfetto.dev (it runs in the browser and uploads nothing: the file stays on
your machine) or in Chrome at ``chrome://tracing``; ``W``/``S`` zoom, ``A``/``D`` pan, a click on a span
shows its args.
"""
from __future__ import annotations

import json
import os
import tempfile

from ..ranks import context

LANE_THREADS = {"compute": (1, "compute"), "comm": (10, "communication"), "data": (30, "data loading")}
GPU_NAMES = {"compute": "compute stream", "comm": "comm stream"}
GAP_S = 0.01  # between runs laid one after another (no clock origin known)


def _tracks(spans: list[dict]) -> list[int]:
    """For the spans of one lane, sorted by start, the track of each: the first track on which it either
    follows what is there or lies wholly inside the span open there (a pack inside a backward) - so that
    the events of every track nest, as the format needs."""
    stacks: list[list[float]] = []  # per track: the ends of the spans still open, outermost first
    placed = []
    for span in spans:
        for track, stack in enumerate(stacks):
            while stack and stack[-1] <= span["start"]:
                stack.pop()
            if not stack or span["end"] <= stack[-1]:
                stack.append(span["end"])
                placed.append(track)
                break
        else:
            stacks.append([span["end"]])
            placed.append(len(stacks) - 1)
    return placed


def _offsets(runs: dict, origins: dict | None) -> dict:
    """Seconds to add to each run's spans on each rank: from the clock origins, else one run after another."""
    ranks = sorted({rank for timelines in runs.values() for rank in timelines})
    if origins and all(origins.get(name, {}).get(rank) is not None for name in runs for rank in runs[name]):
        first = {rank: min(origins[name][rank] for name in runs if rank in runs[name]) for rank in ranks}
        return {name: {rank: origins[name][rank] - first[rank] for rank in runs[name]} for name in runs}
    offsets, at = {}, 0.0
    for name, timelines in runs.items():
        offsets[name] = {rank: at for rank in timelines}
        ends = [span["end"] for spans in timelines.values() for span in spans]
        at += (max(ends) if ends else 0.0) + GAP_S
    return offsets


def trace_events(runs: dict, origins: dict | None = None, device: str = "cpu") -> list[dict]:
    """The events of ``runs`` (run name -> rank -> spans); ``origins`` (run name -> rank -> clock origin in
    seconds) places the runs in time (see the module note)."""
    offsets = _offsets(runs, origins)
    events, threads = [], set()
    for rank in sorted({rank for timelines in runs.values() for rank in timelines}):
        events += [{"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}},
                   {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}}]
        lanes: dict[str, list] = {}
        for name, timelines in runs.items():
            for span in timelines.get(rank, []):
                shift = offsets[name][rank]
                lane = "data" if span["name"] == "data" else span["lane"]  # waiting for a batch: the loader's thread
                lanes.setdefault(lane, []).append({**span, "run": name, "start": span["start"] + shift,
                                                           "end": span["end"] + shift})
        for lane, spans in lanes.items():
            spans.sort(key=lambda s: (s["start"], -s["end"]))
            base, title = LANE_THREADS.get(lane, (40 + len(threads), lane))
            if device == "cuda":
                title = GPU_NAMES.get(lane, title)
            tracks = _tracks(spans)
            for span, track in zip(spans, tracks):
                tid = base + track
                if (rank, tid) not in threads:
                    threads.add((rank, tid))
                    events += [{"ph": "M", "name": "thread_name", "pid": rank, "tid": tid,
                                "args": {"name": title + (f" {track + 1}" if track else "")}},
                               {"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid,
                                "args": {"sort_index": tid}}]
                args = {k: v for k, v in span.items() if k not in ("name", "lane", "start", "end")}
                events.append({"ph": "X", "name": span["name"], "cat": lane, "pid": rank, "tid": tid,
                               "ts": round(span["start"] * 1e6, 3),
                               "dur": round(max(0.0, span["end"] - span["start"]) * 1e6, 3), "args": args})
    return events


def write_trace(path, runs: dict, origins: dict | None = None, device: str = "cpu", about: dict | None = None) -> str:
    """Write ``runs`` (run name -> rank -> spans) to ``path`` as a trace file, atomically; return the path.

    ``about`` goes into the file's ``otherData`` (what ran: model, world, link), which Perfetto shows under
    the trace's info."""
    path = os.fspath(path)
    events = trace_events(runs, origins, device)
    ranks = sorted({rank for timelines in runs.values() for rank in timelines})
    document = {"traceEvents": events, "displayTimeUnit": "ms",
                "otherData": {"written_by": "dpteach", "runs": list(runs), **(about or {})},
                # what torch.profiler writes for a distributed run, so that tools that look for it find the world
                "distributedInfo": {"backend": (about or {}).get("backend", ""), "rank": ranks[0] if ranks else 0,
                                    "world_size": len(ranks)}}
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=folder, prefix=".trace-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(document, f)
        umask = os.umask(0)  # mkstemp made it private: give it the permissions a new file gets here
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
    return path


def save_trace(path, results: dict, device: str = "cpu", about: dict | None = None) -> str | None:
    """:func:`write_trace` of per-rank summaries (``{run name: [rank 0's summary, rank 1's, ...]}``, each with
    ``spans`` and, where the run knows it, ``clock_origin_s``) - by one process only (under torchrun every
    rank runs the experiment); None when no ``path`` was asked for."""
    if path is None or context.rank() != 0:
        return None
    return write_trace(path, run_spans(results), run_origins(results), device, about)


def run_origins(results: dict) -> dict:
    """``{run name: {rank: clock origin}}`` from per-rank summaries (``{run name: [summary of rank 0, ...]}``)."""
    return {name: {rank: summary.get("clock_origin_s") for rank, summary in enumerate(summaries)}
            for name, summaries in results.items()}


def run_spans(results: dict) -> dict:
    """``{run name: {rank: spans}}`` from per-rank summaries (``{run name: [summary of rank 0, ...]}``)."""
    return {name: {rank: summary["spans"] for rank, summary in enumerate(summaries) if summary.get("spans")}
            for name, summaries in results.items()}
