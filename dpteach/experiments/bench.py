"""All-reduce benchmark: time per size and algorithm, with nccl-tests' algbw and busbw.

For each message size and algorithm every rank runs a few warm-up calls, then ``iters`` timed
calls. Each timed call starts after a barrier, and its time is the *slowest* rank's (a collective
is done only when the last rank is done). The reported time is the median over the iterations.

    algbw = bytes / time
    busbw = algbw x 2(W-1)/W      (nccl-tests' doc/PERFORMANCE.md: the rate each rank's link must
                                   carry for an all-reduce built from point-to-point transfers,
                                   whatever the algorithm - ring, tree or other - so it can be
                                   compared with the hardware's peak)

How this differs from nccl-tests (``src/common.cu``, ``BenchTime``): nccl-tests launches ``iters``
calls back to back, reads one host clock around all of them, divides by ``iters``, and by default
averages that time over the ranks. Its figure is therefore a pipelined throughput, in which the
launch and synchronisation cost of one call can hide behind the next. Timing each call on its own,
behind a barrier, shows what one isolated all-reduce costs, latency and the skew between ranks
included - the number the alpha-beta model and a bucket's all-reduce in backward need - and the
median keeps one stray slow call (a busy laptop) from moving it.

The buffer is refilled before every call (outside the timed region) so that repeated sums
never overflow and every algorithm reduces the same numbers.
"""
from __future__ import annotations

import re
import statistics
import time

import torch
import torch.distributed as dist

from .. import validate

from ..ranks import context

from ..collectives import ALL_REDUCE
from ..measure import turned
from ..network import costmodel
from ..ranks.world import World, resolve_world

ALGORITHMS = ("builtin", "ring", "naive", "tree")
_UNITS = {"": 1, "B": 1, "K": 1024, "KB": 1024, "KIB": 1024, "M": 1024**2, "MB": 1024**2,
          "MIB": 1024**2, "G": 1024**3, "GB": 1024**3, "GIB": 1024**3}


def parse_size(text: str) -> int:
    """'4KiB' -> 4096, '16MiB' -> 16777216, '100' -> 100 (bytes; K/M/G are binary multiples)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(text))
    unit = match.group(2).upper() if match else None
    if not match or unit not in _UNITS:
        raise ValueError(f"size {text!r} is not allowed: write a number of bytes with an optional "
                         f"unit, e.g. 4096, 4KiB, 1MiB, 2GiB")
    value = int(float(match.group(1)) * _UNITS[unit])
    if value < 4:
        raise ValueError(f"size {text!r} is not allowed: the smallest message is 4 bytes (one float32)")
    return value


def check_config(sizes, algorithms, iters, warmup, pieces=1) -> None:
    validate.choices("algorithms", algorithms, ALGORITHMS)
    if not sizes:
        raise ValueError("sizes=[] is not allowed: give at least one message size")
    for name, value, low in (("iters", iters, 1), ("warmup", warmup, 0), ("pieces", pieces, 1)):
        validate.integer(name, value, low=low)


def _one_call(algorithm: str, buf: torch.Tensor, pieces: int) -> None:
    if algorithm == "builtin":
        dist.all_reduce(buf)
    elif algorithm == "ring":
        ALL_REDUCE["ring"](buf, check=False, pieces=pieces)
    else:
        ALL_REDUCE[algorithm](buf, check=False)


def time_calls(calls: dict, iters: int, warmup: int, before=None, after=None, samples: bool = False) -> dict:
    """Time each zero-argument function of ``calls`` (name -> function) on every rank; name -> seconds.

    The one timing loop of the course (the sweep below, lesson 02's sweep, ``link_on_rank``). Each call
    starts after a barrier, so that no rank's clock starts while another is still busy with the last
    call, and lasts as long as the slowest rank took (a collective is finished when its last rank
    is); of ``iters`` such times, after ``warmup`` untimed rounds, the median is kept - or, with
    ``samples``, every round's time, for ``dpteach.measure.spread``. The calls are interleaved one by
    one, their order turned every round (A B C, then B C A: ``dpteach/measure.py``'s first rule), so that
    whatever else the machine is doing (on a laptop, plenty) disturbs all of them alike and their ratios
    stay meaningful. ``before(name)`` and ``after(name)``, when given, run untimed around each call (to
    reset or check its buffer).
    """
    names = list(calls)
    times = {name: [] for name in names}
    for i in range(warmup + iters):
        for name in turned(names, i):
            if before is not None:
                before(name)
            context.synchronize()
            dist.barrier()
            start = time.perf_counter()
            calls[name]()
            context.synchronize()
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
            if after is not None:
                after(name)
    out = {}
    for name, values in times.items():
        slowest = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        out[name] = slowest.tolist() if samples else statistics.median(slowest.tolist())
    return out


def checked_buffer(nbytes: int, world: int, device):
    """A buffer of ones to all-reduce, the values to reset it to before each call, and the check after it."""
    source = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
    buf = source.clone()

    def must_be_right(algorithm):  # a benchmark of a wrong answer is worthless
        if not torch.all(buf == world):
            raise RuntimeError(f"{algorithm} all-reduce of {nbytes} bytes gave a wrong result")
    return buf, (lambda _: buf.copy_(source)), must_be_right


def run_on_rank(sizes: list[int], algorithms: list[str], iters: int, warmup: int, pieces: int) -> list[dict]:
    """The per-rank body of the benchmark (call it inside ``dpteach.launch``); rank 0's rows matter."""
    world, me, device = dist.get_world_size(), dist.get_rank(), context.device()
    if me == 0:
        context.report_progress(0, total=len(sizes), desc="all-reduce sweep")
    rows = []
    for nbytes in sizes:
        buf, reset, must_be_right = checked_buffer(nbytes, world, device)
        calls = {algorithm: (lambda a=algorithm: _one_call(a, buf, pieces)) for algorithm in algorithms}
        seconds = time_calls(calls, iters, warmup, before=reset, after=must_be_right)
        for algorithm in algorithms:
            algbw = buf.numel() * 4 / seconds[algorithm] / 1e9
            rows.append({"algorithm": algorithm, "bytes": buf.numel() * 4, "time_s": seconds[algorithm],
                         "algbw_GBps": algbw, "busbw_GBps": algbw * costmodel.busbw_factor(world)})
        if me == 0:
            context.report_progress(1)
    return rows


def allreduce_benchmark(world_size: int | World | None = None, sizes=("4KiB", "1MiB", "16MiB"), algorithms=ALGORITHMS,
                        iters: int = 10, warmup: int = 2, pieces: int = 1, backend: str = "auto",
                        device: str = "auto", timeout: float = 900.0) -> dict:
    """Measure every algorithm at every size on ``world_size`` ranks; return plain data.

    Returns ``{"world_size", "backend", "device", "rows": [...], "fit": {...}}`` where ``fit`` holds
    alpha and beta fitted (least squares) to the ring's times: the machine's latency and inverse
    bandwidth as the course's cost model sees them.
    """
    from ..ranks.launcher import launch
    byte_sizes = [parse_size(s) if isinstance(s, str) else int(s) for s in sizes]
    algorithms = list(algorithms)
    check_config(byte_sizes, algorithms, iters, warmup, pieces)
    world = resolve_world(world_size, backend, device)
    results = launch(run_on_rank, world, args=(byte_sizes, algorithms, iters, warmup, pieces), timeout=timeout)
    rows = results[0]
    report = {"world_size": world.size, "backend": world.backend, "device": world.device_type,
              "rows": rows}
    ring = [(r["bytes"], world.size, r["time_s"]) for r in rows if r["algorithm"] == "ring"]
    if world.size > 1 and len({n for n, _, _ in ring}) >= 2:
        fit = costmodel.fit_alpha_beta(ring, algorithm="ring")
        report["fit"] = fit.as_dict()
    return report


LINK_SIZES = (4096, 4 << 20)  # far apart, so that noise cannot hide the slope (beta)


def link_on_rank(sizes=LINK_SIZES, iters: int = 10) -> dict:
    """Inside a running world: time ``dist.all_reduce`` at a few sizes and fit alpha and beta.

    Every rank must call it (it is a collective). Each timed call starts after a barrier and
    counts as long as the slowest rank took; the median over ``iters`` calls is kept. This is the
    built-in all-reduce the training strategies use, so the fitted alpha is the latency each of
    their messages pays. With one rank there is no link: alpha and beta are 0.
    """
    world = dist.get_world_size()
    if world < 2:
        return {"alpha_s": 0.0, "beta_s_per_byte": 0.0, "samples": []}
    buffers = {nbytes: torch.ones(max(1, nbytes // 4), device=context.device()) for nbytes in sizes}
    seconds = time_calls({n: (lambda b=buf: dist.all_reduce(b)) for n, buf in buffers.items()}, iters, warmup=2)
    samples = [(buf.numel() * 4, world, seconds[n]) for n, buf in buffers.items()]
    fit = costmodel.fit_alpha_beta(samples, algorithm="ring")
    return {**fit.link.as_dict(), "samples": samples}
