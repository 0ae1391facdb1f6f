"""``dpteach diagnose TRACE_DIR``: read every rank's trace of a job and say what slows it down, and which lesson
explains it.

A finding is reported when what it costs is at least ``THRESHOLD`` of the median step (each finding says how
it estimates that), largest first. What each looks like in a trace, and why:

* **a late rank** (lessons 07 and 08). Every rank's first collective of a step ends when the last rank joins
  it, so a collective that ran *short* on one rank means that rank came *late*: rank r's lateness in a step is
  how much longer the others' first collective ran than its own (the median over the others). This needs no
  common clock. A rank late by the same margin step after step is the job's straggler; all others wait that
  long, every step. Its own trace then says why: if it spent the extra time in its DataLoader, the input
  pipeline (lesson 08); otherwise its compute (a slower device, or work the others do not do: lesson 07).
* **no overlap** (lesson 04): every gradient collective was launched after the step's last backward operator,
  so none of it could run during backward; what the rank spent waiting for it is lost.
* **tiny buckets** (lesson 03): far more all-reduces per step than DDP's default buckets would make of the same
  bytes (a first bucket of 1 MiB, then 25 MiB: ``distributed.py``'s ``_DEFAULT_FIRST_BUCKET_BYTES`` and
  ``bucket_cap_mb``), each paying a collective's fixed cost.
* **find_unused_parameters** (lesson 03): with it on, DDP all-reduces a map of which parameters were used,
  an integer tensor with one entry per parameter, after the last bucket of every step (reducer.cpp,
  ``all_reduce_local_used_map``), and after each forward it walks the autograd graph to find the unused ones.
  The parameters that got no gradient in a step are still all-reduced (as zeros) in their buckets.
* **a slow input pipeline everywhere** (lesson 08): every rank spends a share of its steps in its DataLoader.

On GPU traces the same measures are read from the kernels (``measures.py``), and Holistic Trace Analysis'
own analyses (communication-computation overlap, temporal breakdown) are added per rank.
"""
from __future__ import annotations

import math
import os
import time

from .measures import element_count, measure_steps, median
from .traces import read_traces

THRESHOLD = 0.05          # a finding is reported when it costs at least 5% of the median step
LATE_MARGIN = 0.10        # a late rank: late by 10% of a step even in its lower-quartile step
FIRST_BUCKET, BUCKET = 1 << 20, 25 << 20  # DDP's default bucket sizes


def _kib(n: float) -> str:
    return f"{n / 1024:.0f} KiB" if n < (1 << 20) else f"{n / (1 << 20):.1f} MiB"


def _ms(us: float) -> float:
    return round(us / 1000, 2)


def _rank_summary(trace, steps) -> dict:
    def per_step(name):
        return _ms(median([getattr(s, name) for s in steps]))
    floats = [[c for c in s.collectives if c.is_float] for s in steps]
    sizes = [c.bytes for step in floats for c in step]
    return {"rank": trace.rank, "file": trace.file, "steps": len(steps),
            "step_ms": _ms(median([s.duration for s in steps])), "compute_ms": per_step("compute"),
            "data_ms": per_step("data"), "comm_ms": per_step("comm"), "exposed_comm_ms": per_step("exposed_comm"),
            "idle_ms": per_step("idle"),
            "collectives_per_step": median([len(s.collectives) for s in steps]),
            "all_reduces_per_step": median([sum(c.kind == "all_reduce" for c in f) for f in floats]),
            "median_collective_bytes": int(median(sizes)), "bytes_per_step": int(median([sum(c.bytes for c in f)
                                                                                           for f in floats]))}


def _lateness(per_rank) -> list[dict]:
    """Per rank: per step, how much longer the other ranks' first collective ran than this rank's."""
    world, n = len(per_rank), min(len(s) for s in per_rank)
    out = []
    for r in range(world):
        late = []
        for i in range(n):
            firsts = [steps[i].collectives[0].end - steps[i].collectives[0].start if steps[i].collectives else None
                      for steps in per_rank]
            if any(f is None for f in firsts) or world < 2:
                continue
            others = [f for q, f in enumerate(firsts) if q != r]
            late.append(median(others) - firsts[r])
        out.append({"late": late, "median": median(late)})
    return out


def _excess(per_rank, r, name) -> float:
    mine = median([getattr(s, name) for s in per_rank[r]])
    others = median([median([getattr(s, name) for s in steps]) for q, steps in enumerate(per_rank) if q != r])
    return mine - others


def find(per_rank, summaries, traces, lateness) -> list[dict]:
    """The findings that cost at least THRESHOLD of the median step, largest first (``lateness``: ``_lateness``'s)."""
    step = median([s["step_ms"] for s in summaries]) or 1e-9
    found = []

    # -- a late rank ---------------------------------------------------------------------------------------
    if lateness and len(per_rank) > 1:
        r = max(range(len(lateness)), key=lambda q: lateness[q]["median"])
        late = sorted(lateness[r]["late"])
        late_ms = _ms(lateness[r]["median"])
        steps_late = sum(1 for v in late if v > 0)
        # late in every step but at most one, and by a margin in its lower quartile too: a rank that is late
        # now and early then is the machine's noise (on a busy CPU, ranks take turns), not a straggler
        if late and steps_late >= len(late) - 1 and late[len(late) // 4] / 1000 >= LATE_MARGIN * step:
            data_ms, compute_ms = _ms(_excess(per_rank, r, "data")), _ms(_excess(per_rank, r, "compute"))
            common = (f"rank {r} reaches the first collective of a step {late_ms:.1f} ms after the others "
                      f"(late in {steps_late} of {len(late)} steps), so every other rank waits that long")
            if data_ms >= 0.5 * late_ms:
                found.append({"kind": "slow_loader_on_one_rank", "rank": r, "cost": late_ms / step, "lesson": "08",
                              "message": f"{common}: it spends {data_ms:.1f} ms more per step than they do waiting "
                                         f"for its DataLoader - a slow input pipeline on one rank",
                              "try": "give its DataLoader workers (num_workers, pin_memory, prefetch_factor), "
                                     "or find why its data is slower (disk, decode, a larger shard)"})
            else:
                found.append({"kind": "straggler", "rank": r, "cost": late_ms / step, "lesson": "07",
                              "message": f"{common}: it computes {compute_ms:.1f} ms more per step than they do - "
                                         f"a straggler",
                              "try": "check that rank's device (clocks, temperature, other jobs) and whether it "
                                     "does work the others skip (logging, evaluation, a larger batch)"})

    # -- no overlap --------------------------------------------------------------------------------------
    after, exposed = [], []
    for steps in per_rank:
        for s in steps:
            floats = [c for c in s.collectives if c.is_float]
            if floats and s.backward_end is not None:
                after.append(sum(c.bytes for c in floats if c.launch >= s.backward_end) / max(1, sum(c.bytes for c in floats)))
                exposed.append(s.exposed_comm)
    if after and median(after) >= 0.9:
        cost = median(exposed) / 1000 / step
        found.append({"kind": "no_overlap", "cost": cost, "lesson": "04",
                      "message": f"{median(after):.0%} of the gradient bytes were handed to the network after "
                                 f"backward had ended, so none of their transfer overlapped backward; ranks wait "
                                 f"{_ms(median(exposed)):.1f} ms per step for it",
                      "try": "let DDP (or FSDP) launch each bucket from backward's hooks instead of all-reducing "
                             "after loss.backward(); with no_sync() accumulation, sync only on the last micro-step"})

    # -- tiny buckets --------------------------------------------------------------------------------------
    calls = median([s["all_reduces_per_step"] for s in summaries])
    total_bytes = median([s["bytes_per_step"] for s in summaries])
    default_calls = 1 + math.ceil(max(0, total_bytes - FIRST_BUCKET) / BUCKET)
    size = median([s["median_collective_bytes"] for s in summaries])
    if calls >= 8 and calls >= 4 * default_calls and size < FIRST_BUCKET:
        comm = median([s["comm_ms"] for s in summaries])
        cost = comm * (1 - default_calls / calls) / step
        found.append({"kind": "tiny_buckets", "cost": cost, "lesson": "03",
                      "message": f"{calls:.0f} all-reduces of about {_kib(size)} per step, where DDP's default "
                                 f"buckets would send the same {_kib(total_bytes)} in {default_calls}: each pays a "
                                 f"collective's fixed cost",
                      "try": "raise bucket_cap_mb (25 is DDP's default) or leave it unset; with FSDP, wrap "
                             "larger modules"})

    # -- find_unused_parameters ---------------------------------------------------------------------------
    maps, unused, unused_share, map_cost = [], [], [], []
    for trace, steps in zip(traces, per_rank):
        for s, got in zip(steps, _gradients_per_step(trace)):
            integer = [c for c in s.collectives if c.kind == "all_reduce" and not c.is_float]
            if not integer:
                continue
            used_map, floats = integer[-1], [c for c in s.collectives if c.is_float]
            maps.append(used_map.elements)
            if got is not None:
                unused.append(max(0, used_map.elements - got[0]))
                all_reduced = sum(c.elements for c in floats)
                unused_share.append(max(0, all_reduced - got[1]) / max(1, all_reduced))
            # what the map adds: the time it is on the wire after every bucket has finished
            buckets_end = max((c.end for c in floats), default=used_map.start)
            map_cost.append(max(0.0, used_map.end - max(used_map.start, buckets_end)))
    if maps and len(maps) >= 0.9 * sum(len(s) for s in per_rank):
        entries, n_unused, share = int(median(maps)), int(median(unused)), median(unused_share)
        comm = median([s["comm_ms"] for s in summaries])
        cost = (median(map_cost) / 1000 + comm * share) / step
        what = (f"{n_unused} of them ({share:.0%} of the gradient bytes) got no gradient in a step, and their "
                f"buckets still all-reduce them, as zeros" if n_unused else "yet every one got a gradient")
        found.append({"kind": "find_unused_parameters", "cost": cost, "lesson": "03", "unused_tensors": n_unused,
                      "message": f"DDP runs with find_unused_parameters=True: after every forward it walks the "
                                 f"autograd graph, and each step it all-reduces a map of which of its {entries} "
                                 f"parameter tensors were used; {what}",
                      "try": ("remove the unused parameters from the model (or from the optimizer and DDP) and turn "
                              "the option off" if n_unused else "turn find_unused_parameters off: nothing is unused")
                             + "; static_graph=True when the same ones are unused every step"})

    # -- a slow input pipeline on every rank -----------------------------------------------------------------
    shares = [s["data_ms"] / s["step_ms"] for s in summaries if s["step_ms"]]
    if shares and min(shares) >= 2 * THRESHOLD:
        found.append({"kind": "slow_input_pipeline", "cost": min(shares), "lesson": "08",
                      "message": f"every rank spends at least {min(shares):.0%} of each step waiting for its DataLoader",
                      "try": "more DataLoader workers, pin_memory=True, prefetch_factor; decode once, ahead of training"})

    reported = [f for f in found if f["cost"] >= THRESHOLD]
    for f in reported:
        f["cost"] = round(f["cost"], 3)
    return sorted(reported, key=lambda f: -f["cost"])


def _gradients_per_step(trace) -> list:
    """Per step, ``(tensors, elements)`` that received a gradient: autograd's AccumulateGrad nodes that ran,
    with the gradient's shape the profiler recorded (``None`` for a step without any)."""
    runs = [e for e in trace.events if e.get("name") == "torch::autograd::AccumulateGrad"]
    out = []
    for s in trace.steps:
        mine = [e for e in runs if s["ts"] <= e["ts"] < s["ts"] + s["dur"]]
        out.append((len(mine), sum(element_count(e.get("args", {}).get("Input Dims")) for e in mine)) if mine else None)
    return out


def _hta_analyses(folder: str) -> dict:
    """Holistic Trace Analysis' own per-rank analyses of GPU kernels (they need kernels; a CPU trace has none)."""
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError as exc:
        return {"error": f"Holistic Trace Analysis is not installed ({exc}): pip install HolisticTraceAnalysis"}
    analysis = TraceAnalysis(trace_dir=folder)
    out = {}
    for name, call in (("comm_comp_overlap", analysis.get_comm_comp_overlap),
                       ("temporal_breakdown", analysis.get_temporal_breakdown)):
        try:
            frame = call(visualize=False)
            out[name] = frame.to_dict(orient="records")
        except Exception as exc:  # an analysis that cannot read this trace says so; the others still run
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def diagnose(folder: str) -> dict:
    """Read ``folder``'s per-rank traces and return ``{"ranks": [...], "job": {...}, "findings": [...]}``."""
    started = time.perf_counter()
    folder = os.fspath(folder)
    traces = read_traces(folder)
    per_rank = [measure_steps(t) for t in traces]
    summaries = [_rank_summary(t, s) for t, s in zip(traces, per_rank)]
    lateness = _lateness(per_rank)
    for summary, late in zip(summaries, lateness):
        summary["late_ms"] = _ms(late["median"])
    findings = find(per_rank, summaries, traces, lateness)
    slowest = max(summaries, key=lambda s: s["late_ms"])
    job = {"world_size": len(traces), "backend": traces[0].backend, "gpu": any(t.gpu for t in traces),
           "steps": summaries[0]["steps"], "step_ms": median([s["step_ms"] for s in summaries]),
           "slowest_rank": slowest["rank"], "slowest_rank_late_ms": slowest["late_ms"],
           "all_reduces_per_step": median([s["all_reduces_per_step"] for s in summaries]),
           "median_collective_bytes": int(median([s["median_collective_bytes"] for s in summaries])),
           "data_share": round(median([s["data_ms"] / s["step_ms"] for s in summaries if s["step_ms"]]), 3),
           "exposed_comm_share": round(median([s["exposed_comm_ms"] / s["step_ms"] for s in summaries
                                               if s["step_ms"]]), 3),
           "threshold": THRESHOLD,
           "reader": "GPU kernels (and HTA's analyses)" if any(t.gpu for t in traces) else
                     "the profiler's CPU events (a CPU trace has no kernels for HTA's analyses)"}
    result = {"folder": os.path.abspath(folder), "job": job, "ranks": summaries, "findings": findings}
    if job["gpu"]:
        result["hta"] = _hta_analyses(folder)
    result["read_s"] = round(time.perf_counter() - started, 3)
    return result


def report(result: dict) -> str:
    """The diagnosis as text, for the terminal."""
    job = result["job"]
    lines = [f"{job['world_size']} ranks ({job['backend']}), {job['steps']} steps recorded, median step "
             f"{job['step_ms']:.1f} ms; read from {job['reader']}", "",
             f"{'rank':>4} {'step ms':>8} {'compute':>8} {'data':>7} {'comm':>7} {'exposed':>8} {'idle':>6} "
             f"{'colls/step':>10} {'late ms':>8}"]
    for s in result["ranks"]:
        lines.append(f"{s['rank']:>4} {s['step_ms']:>8.1f} {s['compute_ms']:>8.1f} {s['data_ms']:>7.1f} "
                     f"{s['comm_ms']:>7.1f} {s['exposed_comm_ms']:>8.1f} {s['idle_ms']:>6.1f} "
                     f"{s['collectives_per_step']:>10.0f} {s['late_ms']:>8.1f}")
    lines += ["", f"All-reduces per step: {job['all_reduces_per_step']:.0f}, median {_kib(job['median_collective_bytes'])}; "
              f"slowest rank: {job['slowest_rank']} ({job['slowest_rank_late_ms']:.1f} ms late per step); "
              f"data loading {job['data_share']:.0%} of a step; exposed communication {job['exposed_comm_share']:.0%}.", ""]
    if not result["findings"]:
        lines.append(f"No finding costs {job['threshold']:.0%} of a step or more.")
    for i, f in enumerate(result["findings"], 1):
        lines.append(f"{i}. [{f['cost']:.0%} of a step] {f['message']} - lesson {f['lesson']}.")
        lines.append(f"   Try: {f['try']}.")
    return "\n".join(lines)

