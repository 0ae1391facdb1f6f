"""Exercise every CUDA path that one GPU allows, in a few minutes, and say what was measured.

One GPU cannot hold two NCCL ranks, so multi-rank NCCL waits for a multi-GPU machine (the tests
marked ``multigpu``). What one GPU can do, this runs, as two worlds:

1. NCCL with one rank (``cuda``): the launcher's NCCL path and CUDA collectives.
2. Two gloo ranks sharing the GPU: every hand-written collective on CUDA tensors, which gloo's
   point-to-point calls force through host memory (see ``collectives/_p2p.py``).

In each world it checks every all-reduce we wrote, in four dtypes and four sizes (1 element, an odd
count, a small and a 4 MiB buffer), against ``dist.all_reduce`` bit for bit; runs the benchmark;
and trains every strategy, plus gradient accumulation, with CUDA-event timelines, then the CNN
and the transformer with the exact strategies. The exact strategies must still end where
single-process training ends, and ``deterministic`` (with deterministic kernels on a GPU) must equal
the fixed-order reference bit for bit.

The same sequence runs on the CPU (``run_device_checks("cpu")``: two gloo worlds), which is how
the test suite keeps this script honest on machines without a GPU: only CUDA itself goes untested
there. Run it as ``dpteach doctor --gpu`` (``--json`` for the raw report).
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from . import context
from .backend import visible_gpus

# device -> the worlds one such device can hold: (label, backend, ranks, benchmark sizes)
WORLDS = {
    "cuda": (("nccl_w1", "nccl", 1, ("1MiB", "64MiB")), ("gloo_w2", "gloo", 2, ("1MiB", "16MiB"))),
    "cpu": (("gloo_w1", "gloo", 1, ("64KiB", "1MiB")), ("gloo_w2", "gloo", 2, ("64KiB", "1MiB"))),
}
STRATEGIES = ("local", "naive", "bucketed", "overlap", "ddp", "deterministic",
              "int8", "int8_ef", "fp16", "bf16", "async")
OTHER_MODELS = ("cnn", "transformer")  # convolutions and attention take other kernels than the MLP's
EXACT_TOLERANCE = 1e-5


def _collectives() -> dict:
    """On each rank: every all-reduce we wrote must equal the built-in one, on this rank's device."""
    from .collectives import ALL_REDUCE, ring_all_gather, ring_all_reduce, ring_reduce_scatter
    device, rank = context.device(), dist.get_rank()
    out = {"device": str(device)}
    for n in (1, 7, 1000, 1 << 20):  # one element, an odd count, small, 4 MiB of float32
        for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int64):
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


def training_tables(world: dict) -> dict:
    """Every training table of one world, by name: compare, accumulation and one per other model."""
    return {"compare": world["compare"], "accumulation": world["accumulation"], **world.get("models", {})}


def all_checks(report: dict) -> list[tuple[str, bool]]:
    """Every check the report holds, as (name, passed)."""
    checks = []
    for world in report["worlds"]:
        label, device = world["label"], world["device"]
        checks += [(f"{label}: {k}", ok) for k, ok in world["collectives"].items() if k != "device"]
        checks.append((f"{label}: bench ran on {world['bench']['device']}", world["bench"]["device"] == device))
        for key, table in training_tables(world).items():
            checks.append((f"{label}: {key} ran on {table['device']}", table["device"] == device))
            for row in table["rows"]:
                name = f"{label}: {key} {row['strategy']}"
                if row["exact"]:
                    diff = row["max_abs_diff_vs_single"]
                    checks.append((f"{name} within {EXACT_TOLERANCE:g} of one process ({diff:.1e})",
                                   diff <= EXACT_TOLERANCE))
                if row["strategy"] not in ("async", "local"):
                    checks.append((f"{name} replicas identical", row["replicas_identical"]))
        bitwise = world["bitwise"]
        row = next(r for r in bitwise["rows"] if (r["strategy"], r["reference"]) == ("deterministic", "fixed order"))
        checks.append((f"{label}: deterministic {bitwise['model']} ran on {bitwise['device']}",
                       bitwise["device"] == device))
        checks.append((f"{label}: deterministic {bitwise['model']} equals the fixed-order reference bit for bit "
                       f"({row['differing']} weights differ)", row["bitwise_equal"]))
    return checks


def run_device_checks(device: str = "cuda", steps: int = 10) -> dict:
    """Run the checks above on ``device`` ("cuda" or "cpu"); return the report.

    The report holds ``ok`` (every check passed), ``failed`` (the names of those that did not),
    ``checks``, ``seconds`` and, per world, the raw collectives, benchmark and training tables.
    """
    from .bench import allreduce_benchmark
    from .experiments.compare import compare_strategies
    from .experiments.determinism import bitwise_reproducibility
    from .launcher import launch
    if device not in WORLDS:
        raise ValueError(f"device={device!r} is not checkable; choose one of {sorted(WORLDS)}")
    if device == "cuda" and visible_gpus() == 0:
        raise ValueError("--gpu needs a CUDA GPU and this machine has none visible "
                         "(nothing was checked; run it where torch.cuda.is_available() is True)")
    start = time.perf_counter()
    report = {"device": device, "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None, "worlds": []}
    for label, backend, ranks, sizes in WORLDS[device]:
        world = {"label": label, "backend": backend, "world_size": ranks, "device": device}
        world["collectives"] = launch(_collectives, ranks, backend=backend, device=device,
                                      timeout=300, show_output=False)[0]
        world["bench"] = allreduce_benchmark(ranks, sizes, iters=10, backend=backend, device=device)
        world["compare"] = _strip(compare_strategies(ranks, steps=steps, strategies=STRATEGIES,
                                                     backend=backend, device=device))
        world["accumulation"] = _strip(compare_strategies(ranks, steps=steps, accum_steps=2,
                                                          strategies=("naive", "overlap", "ddp"),
                                                          backend=backend, device=device))
        world["models"] = {model: _strip(compare_strategies(ranks, model=model, steps=5,
                                                            strategies=("local", "overlap", "ddp"),
                                                            backend=backend, device=device))
                           for model in OTHER_MODELS}
        world["bitwise"] = bitwise_reproducibility(ranks, model="cnn", steps=4, backend=backend, device=device)
        report["worlds"].append(world)
    checks = all_checks(report)
    report["failed"] = [name for name, ok in checks if not ok]
    report["ok"] = not report["failed"]
    report["checks"] = len(checks)
    report["seconds"] = time.perf_counter() - start
    return report
