"""Lesson 00: what this machine is, and how fast its ranks can talk to each other.

Every later lesson leans on two numbers that differ enormously from one machine to the next: the
latency ``alpha`` every message pays before its first byte arrives, and the time per byte
``beta`` (one over the bandwidth). On a laptop both come from the operating system copying bytes
between processes; on a GPU box from NVLink or PCIe; on a cluster from the network. Measuring them
here, with the same all-reduce sweep ``dpteach bench allreduce`` runs (algbw and busbw as
nccl-tests defines them; each call timed on its own, see ``dpteach/experiments/bench.py``), lets every later
prediction use *this* machine's numbers rather than a textbook's.

``bench.link_on_rank`` is the small version of the same measurement, meant to run inside a world an
experiment has already started (the bucketing and scaling lessons use it), so that the latency
their predictions use is measured in the same processes, at the same moment, as their timings.
"""
from __future__ import annotations

import os
import platform

import torch

from .. import validate

from ..network import costmodel
from ..network.link import resolve_link
from ..ranks.backend import gloo_available, nccl_available
from ..ranks.gpus import read_machine
from ..ranks.world import World, resolve_world
from .bench import allreduce_benchmark, parse_size

DEFAULT_SIZES = ("4KiB", "32KiB", "256KiB", "1MiB", "4MiB")


def describe_machine(world_size: int | World = 2) -> dict:
    """Python, torch, CPUs, GPUs and the backend W ranks get here (what ``dpteach doctor`` prints)."""
    world = resolve_world(world_size)
    gpus = read_machine()  # names, and what they mean for the lessons (dpteach/ranks/gpus.py)
    return {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
            "gpus": [gpu.name for gpu in gpus.gpus], "cuda": torch.version.cuda,
            "gpu_link": gpus.link_sentence() if gpus.count else None, "sixteen_bit": gpus.sixteen_bit()["sentence"],
            "gloo": gloo_available(), "nccl": nccl_available(),
            "placement": {"world_size": world.size, "backend": world.backend, "device": world.device_type}}


def machine_profile(world_size: int | World = 2, sizes=DEFAULT_SIZES, iters: int = 10, warmup: int = 3,
                    algorithms=("builtin", "ring"), backend: str = "auto", device: str = "auto") -> dict:
    """Describe this machine and measure its all-reduce time over a sweep of message sizes.

    Returns plain data::

        {"machine": {python, torch, cpus, gpus, cuda, gloo, nccl, placement},
         "world_size", "backend", "device", "sizes": [bytes, ...],
         "rows": [{algorithm, bytes, time_s, algbw_GBps, busbw_GBps}, ...],   # one per size x algorithm
         "fit": {algorithm: "ring", alpha_s, beta_s_per_byte, bandwidth_GBps, r2},
         "predicted_s": [ring time the fit predicts at each size]}

    The fit is a least-squares line through the ring's times, seen through the ring's formula
    ``2(W-1) alpha + 2(W-1)/W n beta`` (``dpteach.network.costmodel``): alpha is per message, so it is
    comparable across world sizes and algorithms.
    """
    world = resolve_world(world_size, backend, device)
    validate.ranks(world, 2, "measuring a link needs two ranks or more")
    algorithms = list(algorithms)
    if "ring" not in algorithms:
        raise ValueError(f"algorithms={algorithms!r} is not allowed: it must include 'ring', whose times "
                         f"the alpha-beta fit uses")
    byte_sizes = sorted({parse_size(s) if isinstance(s, str) else int(s) for s in sizes})
    if len(byte_sizes) < 2:
        raise ValueError(f"sizes={list(sizes)!r} is not allowed: fitting alpha and beta needs at least two "
                         f"different message sizes")
    # Largest first: whatever the first measurements of a fresh world pay once (connections, page
    # faults, caches) then lands where it is a small fraction of the time, not on the 4 KiB point.
    report = allreduce_benchmark(world, byte_sizes[::-1], algorithms, iters=iters, warmup=warmup)
    link = resolve_link(report["fit"], "fit")
    return {
        "machine": describe_machine(world), "world_size": world.size, "backend": world.backend,
        "device": world.device_type, "sizes": byte_sizes, "rows": report["rows"], "fit": report["fit"],
        "predicted_s": [costmodel.predict("ring", n, world.size, link) for n in byte_sizes],
    }


def measured(result: dict, algorithm: str) -> list[float]:
    """The measured times of one algorithm, in the order of ``result["sizes"]``."""
    by_size = {r["bytes"]: r["time_s"] for r in result["rows"] if r["algorithm"] == algorithm}
    return [by_size[n] for n in result["sizes"]]
