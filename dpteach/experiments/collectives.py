"""Lesson 02: the collectives, the ring step by step, and the alpha-beta model against the clock.

Three experiments, each one launch:

* ``collective_basics`` runs torch's own broadcast, scatter, gather, reduce and all-reduce on
  tiny tensors and returns what every rank held before and after each one.
* ``collective_trace`` runs one of the course's hand-written all-reduces (ring, tree, naive) with
  its ``trace=`` switched on. Every rank contributes the integer ``2**rank``, so a sum can be read
  back as a *set of ranks*: 0b1011 = ranks 0, 1 and 3. ``replay`` then rebuilds every rank's
  buffer after every step from the recorded transfers alone, and the replay must land on the
  buffers the real run produced - the picture the notebook draws is the run, not a cartoon.
* ``allreduce_sweep`` times the algorithms over message sizes (``dpteach.experiments.bench``), fits the link's
  alpha and beta to the ring, and predicts every algorithm from that one fit (Thakur et al. 2005;
  Patarasuk & Yuan 2009), which is how NCCL's tuner chooses: predicted time per algorithm for the
  message at hand, on the topology at hand. The algorithms are timed in interleaved rounds, their order
  rotated every round, and each keeps its rounds: a median with an interval (``dpteach.measure``), so that
  one algorithm is said to beat another at a size only when their intervals separate.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from .. import validate

from ..ranks import context

from ..collectives import ALL_REDUCE, chunk_bounds
from ..measure import ranking, spread
from ..network import costmodel
from ..network.link import resolve_link
from ..ranks.backend import backend_for
from ..ranks.launcher import launch
from ..ranks.world import World, resolve_world
from .bench import _one_call, check_config, checked_buffer, parse_size, time_calls

TRACE_ALGORITHMS = tuple(ALL_REDUCE)  # ring, tree, naive
MODEL_ALGORITHMS = ("ring", "tree", "naive")


# -- torch's built-in collectives on tiny tensors ------------------------------------------------

def _basics_on_rank(n: int) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    # gloo moves host memory, and its gather, scatter and reduce take CPU tensors only; NCCL the opposite.
    device = context.device() if backend_for(context.device().type) == "nccl" else torch.device("cpu")
    mine = torch.arange(n, dtype=torch.float32, device=device) + 10 * rank  # rank r holds 10r, 10r+1, ...
    out = {}

    def record(name, before, after):
        out[name] = {"before": before.tolist(), "after": after.tolist()}

    t = mine.clone()
    dist.broadcast(t, src=0)                            # rank 0's tensor everywhere
    record("broadcast", mine, t)
    pieces = [torch.arange(n, dtype=torch.float32, device=device) + 100 * i for i in range(world)]
    t = torch.zeros(n, device=device)
    dist.scatter(t, pieces if rank == 0 else None, src=0)  # piece i of rank 0 to rank i
    record("scatter", torch.cat(pieces) if rank == 0 else torch.zeros(0), t)
    gathered = [torch.zeros(n, device=device) for _ in range(world)] if rank == 0 else None
    dist.gather(mine, gathered, dst=0)                  # everyone's tensor, stacked on rank 0
    record("gather", mine, torch.cat(gathered) if rank == 0 else torch.zeros(0))
    t = mine.clone()
    dist.reduce(t, dst=0)                               # the sum, on rank 0 only
    record("reduce", mine, t if rank == 0 else torch.zeros(0))
    t = mine.clone()
    dist.all_reduce(t)                                  # the sum, on every rank
    record("all_reduce", mine, t)
    return out


def collective_basics(world_size: int | World | None = 4, numel: int = 2, backend: str = "auto", device: str = "auto") -> dict:
    """Run broadcast, scatter, gather, reduce and all-reduce (torch's own) on ``numel`` numbers per rank.

    Rank r starts with ``[10r, 10r+1, ...]``; scatter's source rank 0 holds pieces ``[100i, ...]``.
    Returns ``{"world_size", "numel", "ops": {op: [{"before": [...], "after": [...]} per rank]}}``;
    an empty list means "this rank holds no result" (gather and reduce deliver to rank 0 only).
    """
    validate.integer("numel", numel, 1, 16, why=" numbers per rank (the demo prints them)")
    world = resolve_world(world_size, backend, device)
    ranks = launch(_basics_on_rank, world, args=(numel,))
    return {"world_size": world.size, "numel": numel, "backend": world.backend,
            "ops": {op: [r[op] for r in ranks] for op in ranks[0]}}


# -- one all-reduce, transfer by transfer --------------------------------------------------------

def _trace_on_rank(numel: int, algorithm: str) -> dict:
    rank = dist.get_rank()
    buf = torch.full((numel,), 1 << rank, dtype=torch.int64, device=context.device())
    trace: list = []
    ALL_REDUCE[algorithm](buf, trace=trace)
    return {"rank": rank, "trace": trace, "final": buf.cpu().tolist()}


def _step_order(transfer: dict) -> tuple:
    phase_rank = {"reduce_scatter": 0, "gather": 0, "reduce": 0, "all_gather": 1, "broadcast": 1}
    return phase_rank[transfer["phase"]], transfer["step"]


def replay(world_size: int, numel: int, transfers: list[dict]) -> list[dict]:
    """Rebuild every rank's buffer after every step from the transfers alone.

    The state of rank r is one frozenset per element: the ranks whose contribution that element
    holds. A reduce-type phase (reduce_scatter, gather, reduce) adds the sender's set to the
    receiver's; a copy-type phase (all_gather, broadcast) replaces it. Transfers in the same step
    happen at the same time, so each step reads the state from before the step.
    Returns ``[{"phase", "step", "transfers": [...], "state": [[set per element] per rank]}, ...]``,
    starting with the initial state (phase ``"start"``).
    """
    state = [[frozenset([r]) for _ in range(numel)] for r in range(world_size)]
    frames = [{"phase": "start", "step": -1, "transfers": [], "state": state}]
    steps: dict = {}
    for t in transfers:
        steps.setdefault(_step_order(t), []).append(t)
    for key in sorted(steps):
        before, after = state, [list(row) for row in state]
        for t in steps[key]:
            for i in range(t["start"], t["stop"]):
                incoming = before[t["src"]][i]
                adds = t["phase"] in ("reduce_scatter", "gather", "reduce")
                after[t["dst"]][i] = (after[t["dst"]][i] | incoming) if adds else incoming
        state = after
        frames.append({"phase": steps[key][0]["phase"], "step": key[1], "transfers": steps[key], "state": state})
    return frames


def _ranks_in(value: int) -> frozenset:
    return frozenset(r for r in range(value.bit_length()) if value >> r & 1)


def collective_trace(world_size: int | World | None = 4, numel: int = 8, algorithm: str = "ring", backend: str = "auto",
                     device: str = "auto") -> dict:
    """Run one traced all-reduce of ``numel`` integers per rank; return its transfers and replayed steps.

    Returns plain data::

        {"world_size", "numel", "algorithm", "chunks": [(start, stop) per chunk],
         "traces": [[transfer dicts recorded by rank r], ...],
         "frames": replay(...),                       # state after each step, sets of rank ids
         "final": [[int per element] per rank],       # the real buffers: sum of 2**r
         "replay_matches_run": bool,                  # replayed final state == real final buffers
         "elements_sent": [per rank], "messages_sent": [per rank]}
    """
    validate.choice("algorithm", algorithm, TRACE_ALGORITHMS)
    validate.integer("numel", numel, 1, 64, why=" elements (each is drawn as a cell)")
    world = resolve_world(world_size, backend, device)
    validate.integer("world_size", world.size, 2, 16, why=" ranks (a trace is drawn rank by rank)")
    ranks = launch(_trace_on_rank, world, args=(numel, algorithm))
    transfers = [t for r in ranks for t in r["trace"]]
    frames = replay(world.size, numel, transfers)
    final = [r["final"] for r in ranks]
    matches = all(frames[-1]["state"][r][i] == _ranks_in(final[r][i])
                  for r in range(world.size) for i in range(numel))
    return {
        "world_size": world.size, "numel": numel, "algorithm": algorithm, "backend": world.backend,
        "chunks": chunk_bounds(numel, world.size), "traces": [r["trace"] for r in ranks],
        "frames": frames, "final": final, "replay_matches_run": matches,
        # counted by sender: the naive root records the transfers it receives as well as sends
        "elements_sent": [sum(t["elements"] for t in transfers if t["src"] == r) for r in range(world.size)],
        "messages_sent": [sum(1 for t in transfers if t["src"] == r) for r in range(world.size)],
    }


# -- the alpha-beta model against measured times -------------------------------------------------

def _sweep_on_rank(sizes: list[int], algorithms: list[str], iters: int, warmup: int) -> list[dict]:
    """Every algorithm at every size, in ``iters`` interleaved rounds whose order rotates (``dpteach.measure``'s
    first rule, kept by ``bench.time_calls``): every call starts after a barrier and counts as long as its
    slowest rank took. Returns rank 0's rows, each with its rounds as a spread."""
    world, me, device = dist.get_world_size(), dist.get_rank(), context.device()
    if me == 0:
        context.report_progress(0, total=len(sizes), desc="all-reduce sweep")
    rows = []
    for nbytes in sizes:
        buf, reset, must_be_right = checked_buffer(nbytes, world, device)
        samples = time_calls({a: (lambda a=a: _one_call(a, buf, 1)) for a in algorithms}, iters, warmup,
                             before=reset, after=must_be_right, samples=True)
        for a in algorithms:
            s = spread(samples[a])
            rows.append({"algorithm": a, "bytes": buf.numel() * 4, "time_s": s.median, "spread": s.as_dict(),
                         "algbw_GBps": buf.numel() * 4 / s.median / 1e9,
                         "busbw_GBps": buf.numel() * 4 / s.median / 1e9 * costmodel.busbw_factor(world)})
        if me == 0:
            context.report_progress(1)
    return rows


def _faster(spreads: dict) -> str | None:
    """The one name faster than every other beyond the noise, or None (a tie: ``dpteach.measure.ranking``)."""
    return ranking(spreads).winner


def allreduce_sweep(world_size: int = 4, sizes=("4KiB", "64KiB", "1MiB", "8MiB", "32MiB"),
                    algorithms=("ring", "tree", "naive", "builtin"), iters: int = 5, backend: str = "auto",
                    device: str = "auto") -> dict:
    """Measure each algorithm at each size, fit alpha and beta to the ring, predict every algorithm.

    Returns plain data::

        {"world_size", "backend", "device", "sizes": [bytes], "rows": [benchmark rows],
         "measured": {algorithm: [median seconds per size]},
         "spreads": {algorithm: [Spread.as_dict() per size]},        # the rounds: median and interval
         "fit": {alpha_s, beta_s_per_byte, bandwidth_GBps, r2},      # from the ring's medians
         "predicted": {ring/tree/naive: [seconds per size]},          # all from that one fit
         "fits": {algorithm: its own alpha and beta, through its own formula},
         "crossover_bytes": tree-vs-ring crossover at this W, or None (ring never loses),
         "model_choice": [ring|tree per size],
         "measured_winner": [ring, tree, or None where their intervals overlap, per size],
         "measured_fastest": [the one algorithm faster than all others beyond the noise, or None, per size],
         "iters", "cores": CPU cores here}
    """
    algorithms = list(algorithms)
    if "ring" not in algorithms:
        raise ValueError(f"algorithms={algorithms!r} is not allowed: include 'ring', which the fit uses")
    byte_sizes = sorted({parse_size(s) if isinstance(s, str) else int(s) for s in sizes})
    check_config(byte_sizes, algorithms, iters, 1)
    world = resolve_world(world_size, backend, device)
    if world.size < 2 or len(byte_sizes) < 2:
        raise ValueError(f"world_size={world_size!r} and sizes={list(sizes)!r} are not allowed together: "
                         f"a fit needs at least 2 ranks and 2 different sizes")
    # largest first, so that the one-off costs of a fresh world do not land on the smallest size
    rows = launch(_sweep_on_rank, world, args=(byte_sizes[::-1], algorithms, iters, 1), timeout=900.0)[0]
    at = {(r["algorithm"], r["bytes"]): r for r in rows}
    measured = {a: [at[(a, n)]["time_s"] for n in byte_sizes] for a in algorithms}
    spreads = {a: [at[(a, n)]["spread"] for n in byte_sizes] for a in algorithms}
    fit = costmodel.fit_alpha_beta([(n, world.size, t) for n, t in zip(byte_sizes, measured["ring"])], algorithm="ring")
    link = resolve_link(fit.as_dict(), "fit")
    predicted = {a: [costmodel.predict(a, n, world.size, link) for n in byte_sizes] for a in MODEL_ALGORITHMS}
    fits = {}
    for a, times in measured.items():  # each algorithm's own alpha and beta, seen through its own formula
        shape = a if a in MODEL_ALGORITHMS else "ring"  # gloo's built-in is ring-like for large messages
        own = costmodel.fit_alpha_beta([(n, world.size, t) for n, t in zip(byte_sizes, times)], algorithm=shape)
        fits[a] = {**own.as_dict(), "formula": shape}

    def as_spreads(names, i):
        return {a: spread(spreads[a][i]["samples"]) for a in names}
    winners = None
    if "tree" in measured:
        winners = [_faster(as_spreads(("ring", "tree"), i)) for i in range(len(byte_sizes))]
    return {
        "world_size": world.size, "backend": world.backend, "device": world.device_type,
        "sizes": byte_sizes, "rows": rows, "measured": measured, "spreads": spreads, "iters": iters,
        "fit": fit.as_dict(), "predicted": predicted, "fits": fits,
        "crossover_bytes": costmodel.crossover_bytes(world.size, link),
        "model_choice": [costmodel.choose_algorithm(n, world.size, link).algorithm for n in byte_sizes],
        "measured_winner": winners,
        "measured_fastest": [_faster(as_spreads(algorithms, i)) for i in range(len(byte_sizes))],
        "cores": os.cpu_count() or 1,
    }
