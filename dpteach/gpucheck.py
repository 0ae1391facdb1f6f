"""Exercise every CUDA path that one GPU allows, in a few minutes, and say what was measured.

One GPU cannot hold two NCCL ranks, so multi-rank NCCL waits for a multi-GPU machine (the tests
marked ``multigpu``). What one GPU can do, this runs:

1. NCCL with one rank: the launcher's NCCL path, a CUDA all-reduce.
2. Two gloo ranks computing on the same GPU: every hand-written collective on CUDA tensors
   (staged through host memory, as gloo requires) against ``dist.all_reduce``.
3. The benchmark: NCCL at W=1 and gloo-on-GPU at W=2.
4. Training: ``compare`` at W=1 on CUDA (NCCL) and at W=2 with gloo ranks sharing the GPU, with
   CUDA-event timelines; the exact strategies must still match single-process training.

Run it as ``dpteach doctor --gpu`` (``--json`` for the raw report).
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from . import context
from .backend import visible_gpus


def _collectives_on_cuda() -> dict:
    from .collectives import ALL_REDUCE, ring_all_gather, ring_reduce_scatter
    device, rank = context.device(), dist.get_rank()
    out = {"device": str(device)}
    for n in (1, 7, 1000, 1 << 20):
        for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int64):
            x = (torch.arange(n, device=device) % 13 + rank).to(dtype)
            expected = x.clone().to(torch.float64)
            dist.all_reduce(expected)
            for name, fn in ALL_REDUCE.items():
                y = x.clone()
                fn(y)
                key = f"{name}/{str(dtype)[6:]}/{n}"
                out[key] = bool(y.is_cuda and torch.equal(y.to(torch.float64), expected))
    x = torch.arange(10.0, device=device) + rank
    whole = ring_all_gather(ring_reduce_scatter(x))
    expected = x.clone()
    dist.all_reduce(expected)
    out["reduce_scatter+all_gather"] = bool(whole.is_cuda and torch.equal(whole, expected))
    return out


def run_gpu_checks(steps: int = 10) -> dict:
    """Run the checks above; return a report with ``ok`` (all passed) and the measurements."""
    from .bench import allreduce_benchmark
    from .experiments.compare import compare_strategies
    from .launcher import launch
    if visible_gpus() == 0:
        raise ValueError("--gpu needs a CUDA GPU and this machine has none visible "
                         "(nothing was checked; run it where torch.cuda.is_available() is True)")
    report, start = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}, time.perf_counter()
    (nccl_one,) = launch(_collectives_on_cuda, 1, backend="nccl", timeout=300, show_output=False)
    report["nccl_w1_collectives"] = nccl_one
    gloo_two = launch(_collectives_on_cuda, 2, backend="gloo", device="cuda", timeout=300, show_output=False)
    report["gloo_cuda_w2_collectives"] = gloo_two[0]
    report["bench_nccl_w1"] = allreduce_benchmark(1, ("1MiB", "64MiB"), ("builtin", "ring"), iters=10, backend="nccl")
    report["bench_gloo_cuda_w2"] = allreduce_benchmark(2, ("1MiB", "16MiB"), iters=5, backend="gloo", device="cuda")
    strategies = ("local", "naive", "bucketed", "overlap", "ddp", "int8", "fp16")
    for label, world, backend in (("compare_nccl_w1", 1, "nccl"), ("compare_gloo_cuda_w2", 2, "gloo")):
        result = compare_strategies(world, steps=steps, strategies=strategies, backend=backend, device="cuda")
        report[label] = {"device": result["device"], "backend": result["backend"], "rows": result["rows"]}
    checks = [v for key in ("nccl_w1_collectives", "gloo_cuda_w2_collectives")
              for k, v in report[key].items() if k != "device"]
    for key in ("compare_nccl_w1", "compare_gloo_cuda_w2"):
        checks += [r["max_abs_diff_vs_single"] <= 1e-5 for r in report[key]["rows"] if r["exact"]]
    report["ok"] = all(checks)
    report["checks"] = len(checks)
    report["seconds"] = time.perf_counter() - start
    return report
