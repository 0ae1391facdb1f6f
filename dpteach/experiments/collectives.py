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
  message at hand, on the topology at hand.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from .. import validate

from ..ranks import context

from ..collectives import ALL_REDUCE, chunk_bounds
from ..network import costmodel
from ..network.link import resolve_link
from ..ranks.backend import backend_for
from ..ranks.launcher import launch
from ..ranks.world import World, resolve_world
from .bench import allreduce_benchmark, parse_size

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

def allreduce_sweep(world_size: int = 4, sizes=("4KiB", "64KiB", "1MiB", "8MiB", "32MiB"),
                    algorithms=("ring", "tree", "naive", "builtin"), iters: int = 5, backend: str = "auto",
                    device: str = "auto") -> dict:
    """Measure each algorithm at each size, fit alpha and beta to the ring, predict every algorithm.

    Returns plain data::

        {"world_size", "backend", "device", "sizes": [bytes], "rows": [benchmark rows],
         "measured": {algorithm: [seconds per size]},
         "fit": {alpha_s, beta_s_per_byte, bandwidth_GBps, r2},      # from the ring's times
         "predicted": {ring/tree/naive: [seconds per size]},          # all from that one fit
         "fits": {algorithm: its own alpha and beta, through its own formula},
         "crossover_bytes": tree-vs-ring crossover at this W, or None (ring never loses),
         "model_choice": [ring|tree per size], "measured_winner": [faster of ring/tree per size],
         "measured_fastest": [fastest of every measured algorithm per size], "cores": CPU cores here}
    """
    algorithms = list(algorithms)
    if "ring" not in algorithms:
        raise ValueError(f"algorithms={algorithms!r} is not allowed: include 'ring', which the fit uses")
    byte_sizes = sorted({parse_size(s) if isinstance(s, str) else int(s) for s in sizes})
    # largest first, so that the one-off costs of a fresh world do not land on the smallest size
    report = allreduce_benchmark(world_size, byte_sizes[::-1], algorithms, iters=iters, warmup=1,
                                 backend=backend, device=device)
    if "fit" not in report:
        raise ValueError(f"world_size={world_size!r} and sizes={list(sizes)!r} are not allowed together: "
                         f"a fit needs at least 2 ranks and 2 different sizes")
    link = resolve_link(report["fit"], "fit")
    measured = {a: [next(r["time_s"] for r in report["rows"] if r["algorithm"] == a and r["bytes"] == n)
                    for n in byte_sizes] for a in algorithms}
    predicted = {a: [costmodel.predict(a, n, world_size, link) for n in byte_sizes] for a in MODEL_ALGORITHMS}
    fits = {}
    for a, times in measured.items():  # each algorithm's own alpha and beta, seen through its own formula
        shape = a if a in MODEL_ALGORITHMS else "ring"  # gloo's built-in is ring-like for large messages
        fit = costmodel.fit_alpha_beta([(n, world_size, t) for n, t in zip(byte_sizes, times)], algorithm=shape)
        fits[a] = {**fit.as_dict(), "formula": shape}
    winners = None
    if "tree" in measured:
        winners = ["tree" if t < r else "ring" for t, r in zip(measured["tree"], measured["ring"])]
    return {
        "world_size": world_size, "backend": report["backend"], "device": report["device"],
        "sizes": byte_sizes, "rows": report["rows"], "measured": measured, "fit": report["fit"],
        "predicted": predicted, "fits": fits, "crossover_bytes": costmodel.crossover_bytes(world_size, link),
        "model_choice": [costmodel.choose_algorithm(n, world_size, link).algorithm for n in byte_sizes],
        "measured_winner": winners,
        "measured_fastest": [min(measured, key=lambda a: measured[a][i]) for i in range(len(byte_sizes))],
        "cores": os.cpu_count() or 1,
    }
