"""Read a folder of per-rank ``torch.profiler`` traces, and refuse one that cannot be diagnosed, saying why.

What the diagnosis needs from each file, and where torch.profiler puts it (a Chrome Trace Event Format JSON
object; Kineto writes it, ``schemaVersion`` 1 since torch 1.8):

* ``distributedInfo``: ``rank``, ``world_size``, ``backend`` - present when a process group existed;
* ``ProfilerStep#N`` spans (``prof.step()`` under a schedule), on the thread that ran the training loop;
* complete events (``"ph": "X"``, ``ts``/``dur`` in microseconds): the operators on the CPU threads and, on a
  GPU, the kernels on each stream (``cat`` ``kernel``).

A trace is refused with a message that says what is wrong and what to do: a folder without traces, a file
that is not JSON or not a torch.profiler trace, a schema this reader does not know, a trace without steps,
two traces of one rank, or a missing rank. Gzipped traces (``.json.gz``, as TensorBoard's handler writes) are read too.
"""
from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass, field

KNOWN_SCHEMAS = (1,)
STEP_PREFIX = "ProfilerStep#"


class TraceError(ValueError):
    """A trace folder that cannot be diagnosed; the message says why and what to do."""


@dataclass
class RankTrace:
    rank: int
    world_size: int
    backend: str
    path: str
    events: list = field(repr=False)  # the complete ("X") events, sorted by start
    steps: list = field(repr=False)   # the ProfilerStep spans, in order
    main_thread: object = None        # (pid, tid) of the training loop
    gpu: bool = False                 # whether it holds GPU kernels
    host: str = ""                    # the machine it ran on (ranks of one host share a clock)
    thread_names: dict = field(default_factory=dict, repr=False)  # (pid, tid) -> name, as the trace names them

    @property
    def file(self) -> str:
        return os.path.basename(self.path)


def trace_files(folder: str) -> list[str]:
    if not isinstance(folder, (str, os.PathLike)):
        raise TraceError(f"TRACE_DIR={folder!r} is not allowed: it must be a folder's path")
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        raise TraceError(f"TRACE_DIR {folder!r} is not a folder" + ("" if os.path.exists(folder) else " (it does not exist)")
                         + ": give the folder that `dpteach profile --out` wrote")
    files = sorted(os.path.join(folder, name) for name in os.listdir(folder)
                   if name.endswith((".json", ".json.gz")) and not name.startswith("merged"))
    if not files:
        raise TraceError(f"no trace in {folder!r} (no *.json or *.json.gz file): record one with "
                         f"`dpteach profile --out {folder} -- torchrun ... train.py`")
    return files


def _load(path: str) -> dict:
    opener = gzip.open if path.endswith(".gz") else open
    name = os.path.basename(path)
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            document = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError, OSError, EOFError) as exc:
        raise TraceError(f"{name} is not a readable JSON trace ({exc}); a trace cut short by a crash is "
                         f"not whole: record the job again") from None
    if not isinstance(document, dict) or not isinstance(document.get("traceEvents"), list):
        raise TraceError(f"{name} is not a torch.profiler trace: it has no traceEvents list")
    schema = document.get("schemaVersion")
    if schema is None:
        raise TraceError(f"{name} has traceEvents but no schemaVersion: it was not written by torch.profiler "
                         f"(a trace from another tool, or one the course drew itself?)")
    if schema not in KNOWN_SCHEMAS:
        raise TraceError(f"{name} has schemaVersion {schema!r}; this reader knows version(s) "
                         f"{', '.join(map(str, KNOWN_SCHEMAS))} (torch.profiler of torch 1.8 and later): "
                         f"record it with the torch this course installs")
    return document


def read_trace(path: str) -> RankTrace:
    document, name = _load(path), os.path.basename(path)
    info = document.get("distributedInfo")
    if not isinstance(info, dict) or "rank" not in info:
        raise TraceError(f"{name} has no distributedInfo: no process group existed when it was recorded "
                         f"(record after init_process_group; `dpteach profile` does)")
    events = sorted((e for e in document["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"
                     and isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float))),
                    key=lambda e: e["ts"])
    steps = [e for e in events if str(e.get("name", "")).startswith(STEP_PREFIX)]
    if not steps:
        raise TraceError(f"{name} has no {STEP_PREFIX}N spans, so its steps cannot be told apart: record "
                         f"with a schedule and call prof.step() after each step (`dpteach profile` does)")
    return RankTrace(rank=int(info["rank"]), world_size=int(info.get("world_size", 1)),
                     backend=str(info.get("backend", "?")), path=path, events=events, steps=steps,
                     main_thread=(steps[0]["pid"], steps[0]["tid"]),
                     gpu=any(e.get("cat") == "kernel" for e in events), host=str(document.get("host_name", "")),
                     thread_names={(e.get("pid"), e.get("tid")): str(e.get("args", {}).get("name"))
                                   for e in document["traceEvents"] if isinstance(e, dict) and e.get("ph") == "M"
                                   and e.get("name") == "thread_name"})


def read_traces(folder: str) -> list[RankTrace]:
    """Every rank's trace in ``folder``, by rank; refused (``TraceError``) unless ranks 0..W-1 are all there once."""
    traces: dict[int, RankTrace] = {}
    for path in trace_files(folder):
        trace = read_trace(path)
        if trace.rank in traces:
            raise TraceError(f"{traces[trace.rank].file} and {trace.file} are both rank {trace.rank}: "
                             f"traces of two runs in one folder? Keep one run per folder")
        traces[trace.rank] = trace
    sizes = {t.world_size for t in traces.values()}
    if len(sizes) > 1:
        raise TraceError(f"the traces disagree on the world size ({sorted(sizes)}): two runs in one folder?")
    world = sizes.pop()
    missing = [r for r in range(world) if r not in traces]
    if missing:
        found = ", ".join(map(str, sorted(traces)))
        which = "rank " + ", ".join(map(str, missing))
        raise TraceError(f"{which}'s trace {'is' if len(missing) == 1 else 'are'} missing: the traces say world "
                         f"size {world}, and {folder!r} holds rank(s) {found}. A rank that crashed or stopped "
                         f"before its last recorded step writes none: record again")
    counts = {t.rank: len(t.steps) for t in traces.values()}
    if len(set(counts.values())) > 1:
        raise TraceError(f"the ranks recorded different numbers of steps ({counts}): they must record the same "
                         f"steps to be compared (record_steps hooks optimizer.step(); does one rank step more?)")
    return [traces[r] for r in range(world)]
