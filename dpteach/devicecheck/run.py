"""Exercise every CUDA path that one GPU allows, in a few minutes, and say what was measured.

On a machine with one GPU this runs four worlds:

1. NCCL with one rank (``nccl_w1``): the launcher's NCCL path and CUDA collectives - but with one
   rank there is no peer, so no point-to-point message ever crosses NCCL here.
2. Two gloo ranks sharing the GPU (``gloo_w2``): every hand-written collective on CUDA tensors, which
   gloo's point-to-point calls force through host memory (see ``collectives/_p2p.py``).
3. Two NCCL ranks sharing the GPU (``nccl_shared_w2``), and 4. three (``nccl_shared_w3``, collectives
   only): NCCL refuses two ranks on one GPU of one machine, but gives each rank its own host id
   (``NCCL_HOSTID``) and it connects them like two machines, over sockets on the loopback interface
   (``backend.nccl_may_share_gpus``). That is what lets one GPU check the multi-rank NCCL paths:
   batched point-to-point (every hand-written collective, int16 included, which NCCL has no type
   for), overlap hooks launching NCCL work from autograd, the compressed strategies, the parameter
   server in an NCCL world, and a failing rank's error coming home. **Correctness only: these
   timings mean nothing** (the ranks take turns on the GPU and talk over sockets, not NVLink). Where
   the trick does not work (an NCCL that refuses it), the world fails within a minute, and the report
   says so and goes on.

In each world it checks every all-reduce we wrote, in five dtypes and four sizes (1 element, an odd
count, a small and a 4 MiB buffer), against ``dist.all_reduce`` bit for bit; runs the benchmark;
trains every strategy, plus gradient accumulation, with CUDA-event timelines, then the CNN and the
transformer with the exact strategies; lesson 12's fp32, bf16 and fp16 side by side; and, with two
ranks or more, lesson 11's sharded strategies (zero1-3 and FSDP2 against ddp) and one rank failing
while its peer waits in a collective. The exact strategies must still end where single-process
training ends (computed on the same GPU), and ``deterministic`` (with deterministic kernels on a GPU)
must equal the fixed-order reference bit for bit. The one-rank world also runs one rank standing for
eight (``peers="emulated"``) on a slow emulated link: the link, spent on a CUDA stream of its own, must
set every message's time, keep to the link's times within 10%, and ``naive`` must wait for all of it.
(These checks train the laptop models: correctness, not speed; ``scripts/gpu_lessons.py`` runs every
lesson with the GPU-sized ones.)

The same sequence runs on the CPU (``run_device_checks("cpu")``: two gloo worlds), which is how
the test suite keeps this script honest on machines without a GPU: only CUDA itself goes untested
there. Run it as ``dpteach doctor --gpu`` (``--json`` for the raw report), or ``scripts/gpu_check.sh``
for the report files and the GPU tests too.
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager

import torch
import torch.distributed as dist

from ..ranks import context
from ..ranks.backend import SHARED_GPU_SWITCH, visible_gpus

from .verdict import EMULATED_W, FULL, all_checks

COLLECTIVES_ONLY = "collectives"
# device -> the worlds one such device can hold: (label, backend, ranks, benchmark sizes, what runs)
WORLDS = {
    "cuda": (("nccl_w1", "nccl", 1, ("1MiB", "64MiB"), FULL), ("gloo_w2", "gloo", 2, ("1MiB", "16MiB"), FULL),
             ("nccl_shared_w2", "nccl", 2, ("64KiB", "1MiB"), FULL),
             ("nccl_shared_w3", "nccl", 3, ("64KiB",), COLLECTIVES_ONLY)),
    "cpu": (("gloo_w1", "gloo", 1, ("64KiB", "1MiB"), FULL), ("gloo_w2", "gloo", 2, ("64KiB", "1MiB"), FULL)),
}
SHARED_GPU_JOIN_TIMEOUT = 60  # seconds: a shared-GPU world that cannot form says so within this
STRATEGIES = ("local", "naive", "bucketed", "overlap", "ddp", "deterministic",
              "int8", "int8_ef", "fp16", "bf16", "async")
SHARDED = ("ddp", "zero1", "zero2", "zero3", "fsdp")  # lesson 11: ddp is the reference they are held to
EMULATED_LINK = {"name": "check link", "alpha_s": 1e-3, "beta_s_per_byte": 1e-9}  # a millisecond and more per message
OTHER_MODELS = ("cnn", "transformer")  # convolutions and attention take other kernels than the MLP's


def _collectives() -> dict:
    """On each rank: every all-reduce we wrote must equal the built-in one, on this rank's device."""
    from ..collectives import ALL_REDUCE, ring_all_gather, ring_all_reduce, ring_reduce_scatter
    device, rank = context.device(), dist.get_rank()
    out = {"device": str(device)}
    for n in (1, 7, 1000, 1 << 20):  # one element, an odd count, small, 4 MiB of float32
        for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int16):
            x = (torch.arange(n, device=device) % 13 + rank).to(dtype)  # small integers: exact in every dtype
            expected = x.clone().to(torch.float64)
            dist.all_reduce(expected)
            for name, fn in ALL_REDUCE.items():
                y = x.clone()
                fn(y)
                key = f"{name}/{str(dtype).removeprefix('torch.')}/{n}"
                out[key] = bool(y.device == device and y.dtype == dtype and torch.equal(y.to(torch.float64), expected))
    x = (torch.arange(1000, device=device) % 13 + rank).float()
    expected = x.clone()
    dist.all_reduce(expected)
    ring_all_reduce(x, pieces=4)
    out["ring pieces=4"] = bool(x.device == device and torch.equal(x, expected))
    x = torch.arange(10.0, device=device) + rank
    whole = ring_all_gather(ring_reduce_scatter(x))
    expected = x.clone()
    dist.all_reduce(expected)
    out["reduce_scatter+all_gather"] = bool(whole.device == device and torch.equal(whole, expected))
    return out


def _strip(result: dict) -> dict:
    keep = ("world_size", "backend", "device", "accum_steps", "rows")
    return {k: result[k] for k in keep}


def _fail_on_one_rank() -> None:
    """Rank 1 raises while rank 0 waits in an all-reduce on its device: the error must come home."""
    if dist.get_rank() == 1:
        raise RuntimeError("a deliberate failure on rank 1")
    x = torch.ones(4, device=context.device())
    dist.all_reduce(x)  # rank 1 never joins: rank 0 waits here until the launcher stops it
    context.synchronize()


def _failure_comes_home(world, timeout: float = 60.0) -> dict:
    """Launch :func:`_fail_on_one_rank`; report which rank the launcher blamed, for what, and how fast."""
    from ..ranks.launcher import RankError, launch
    start = time.perf_counter()
    try:
        launch(_fail_on_one_rank, world, timeout=timeout, show_output=False)
    except RankError as err:
        return {"rank": err.rank, "reported": "a deliberate failure on rank 1" in str(err),
                "seconds": time.perf_counter() - start, "timeout": timeout}
    except TimeoutError:
        pass  # the error never came home: reported as such below
    return {"rank": None, "reported": False, "seconds": time.perf_counter() - start, "timeout": timeout}


@contextmanager
def _nccl_sharing_gpus(on: bool):
    """Let NCCL worlds put several ranks on one GPU for the block (``backend.nccl_may_share_gpus``)."""
    if not on:
        yield
        return
    saved = os.environ.get(SHARED_GPU_SWITCH)
    os.environ[SHARED_GPU_SWITCH] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(SHARED_GPU_SWITCH, None)
        else:
            os.environ[SHARED_GPU_SWITCH] = saved


def _check_world(label, backend, ranks, sizes, scope, device, steps) -> dict:
    from ..ranks.launcher import launch
    from ..ranks.world import resolve_world
    from ..experiments.bench import allreduce_benchmark
    from ..experiments.compare import compare_strategies
    from ..experiments.determinism import bitwise_reproducibility
    from ..experiments.mixed_precision import precision_drift
    shared = device == "cuda" and backend == "nccl" and ranks > visible_gpus()
    row = {"label": label, "backend": backend, "world_size": ranks, "device": device, "scope": scope,
           "shares_gpu": shared, "timings_meaningful": not shared}
    with _nccl_sharing_gpus(shared):
        world = resolve_world(ranks, backend, device)  # once: every check below runs in this world
        try:  # the first launch is the one that finds out whether this world can form at all
            row["collectives"] = launch(_collectives, world, timeout=SHARED_GPU_JOIN_TIMEOUT if shared else 300,
                                        show_output=False)[0]
        except Exception as exc:
            if not shared:
                raise
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            row["unavailable"] = (f"{ranks} NCCL ranks could not share this GPU ({type(exc).__name__}: {first}); "
                                  f"multi-rank NCCL was not covered - run the multigpu tests on a machine with "
                                  f"two GPUs or more")
            return row
        if ranks > 1:
            row["failure"] = _failure_comes_home(world)
        if scope != FULL:
            return row
        row["bench"] = allreduce_benchmark(world, sizes, iters=10)
        row["compare"] = _strip(compare_strategies(world, model="mlp", steps=steps, strategies=STRATEGIES))
        row["accumulation"] = _strip(compare_strategies(world, model="mlp", steps=steps, accum_steps=2,
                                                        strategies=("naive", "overlap", "ddp")))
        row["models"] = {model: _strip(compare_strategies(world, model=model, steps=5,
                                                          strategies=("local", "overlap", "ddp")))
                         for model in OTHER_MODELS}
        row["bitwise"] = bitwise_reproducibility(world, model="cnn", steps=4)
        row["precision"] = _precisions(precision_drift(world, model="mlp", steps=4, batch_per_rank=16))
        if ranks > 1:  # sharding needs ranks to share the work
            sharded = compare_strategies(world, model="mlp", steps=4, optimizer="adam", strategies=SHARDED)
            row["sharded"] = {**_strip(sharded), "tolerance": sharded["tolerance"]}  # Adam's, not SGD's
        else:  # one rank standing for 8: the emulated link, on this device's clock
            row["emulated_peers"] = _emulated_peers(backend, device)
    return row


def _precisions(result: dict) -> dict:
    keep = ("precision", "relative_drift", "skipped_steps", "state_bytes", "replicas_identical", "step_vs_fp32")
    return {"device": result["device"], "tolerance": result["tolerance"], "fp32_vs_single": result["fp32_vs_single"],
            "rows": [{k: r[k] for k in keep} for r in result["rows"]]}


def _emulated_peers(backend: str, device: str) -> dict:
    """``naive`` and ``overlap`` with one real rank standing for 8, on a link slow enough to set every time."""
    from ..ranks.world import resolve_world
    from ..experiments.compare import compare_strategies
    world = resolve_world(EMULATED_W, backend, device, peers="emulated", emulated_peers_ok=True)
    result = compare_strategies(world, model="mlp", steps=6, link=EMULATED_LINK, strategies=("local", "naive", "overlap"))
    return {"world_size": result["world_size"], "real_ranks": result["real_ranks"], "device": result["device"],
            "rows": [{k: r[k] for k in ("strategy", "step_time_s", "exposed_comm_s", "bytes_per_step", "link_report")}
                     for r in result["rows"]],
            "link_seconds": {r["strategy"]: r["link_report"]["link_seconds_per_step"] for r in result["rows"]
                             if r["link_report"]}}


def run_device_checks(device: str = "cuda", steps: int = 10) -> dict:
    """Run the checks above on ``device`` ("cuda" or "cpu"); return the report.

    The report holds ``ok`` (every check passed), ``failed`` (the names of those that did not),
    ``unavailable`` (worlds that could not form, with the reason), ``checks``, ``seconds`` and, per
    world, the raw collectives, failure, benchmark and training tables.
    """
    if device not in WORLDS:
        raise ValueError(f"device={device!r} is not checkable; choose one of {sorted(WORLDS)}")
    if device == "cuda" and visible_gpus() == 0:
        raise ValueError("--gpu needs a CUDA GPU and this machine has none visible "
                         "(nothing was checked; run it where torch.cuda.is_available() is True)")
    start = time.perf_counter()
    report = {"device": device, "torch": torch.__version__, "cuda": torch.version.cuda,
              "nccl": ".".join(map(str, torch.cuda.nccl.version())) if device == "cuda" else None,
              "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None, "gpus": visible_gpus(),
              "worlds": []}
    for label, backend, ranks, sizes, scope in WORLDS[device]:
        report["worlds"].append(_check_world(label, backend, ranks, sizes, scope, device, steps))
    checks = all_checks(report)
    report["failed"] = [name for name, ok in checks if not ok]
    report["unavailable"] = [f"{w['label']}: {w['unavailable']}" for w in report["worlds"] if w.get("unavailable")]
    report["ok"] = not report["failed"]
    report["checks"] = len(checks)
    report["seconds"] = time.perf_counter() - start
    return report
