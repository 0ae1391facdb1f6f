"""A lone rank against a plain process: does a world of one rank train as fast as the same code alone?

    python benchmarks/lone_rank.py      # writes results/lone_rank_cpu.json (about a minute on 2 cores)

The same model, batch, optimizer and thread count, trained for the same steps two ways, alternating
three times so that a change in the machine's load hits both alike: in this process, a plain loop of
forward, backward, step; and in a world of one rank started by ``dpteach.launch``, the ``local``
strategy (no communication). The bar (issue 27): the rank's median step within 1.5x of the plain
process's. It failed when the launcher pinned a lone rank to one core and still gave it a thread per
core: the threads took turns on that core and a step took tens of times longer.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.run import RESULTS, machine  # noqa: E402
from dpteach.ranks.backend import cores_available  # noqa: E402
from dpteach.replica.data import global_batches, loss_fn, make_dataset, sample_batch  # noqa: E402
from dpteach.experiments import compare_strategies  # noqa: E402
from dpteach.replica.models import DEFAULT_LR, build_model  # noqa: E402

MODEL, BATCH, STEPS, ROUNDS = "transformer", 32, 20, 3


def plain_process_step() -> float:
    """Median seconds of a step of the plain loop, with one thread per core this process may use."""
    torch.set_num_threads(cores_available())
    model, data, loss_of = build_model(MODEL), make_dataset(MODEL, BATCH * STEPS), loss_fn(MODEL)
    optimizer = torch.optim.SGD(model.parameters(), lr=DEFAULT_LR[MODEL], momentum=0.9)
    times = []
    for indices in global_batches(data, BATCH, world_size=1):
        start = time.perf_counter()
        x, y = sample_batch(data, indices)
        loss = loss_of(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times[2:])


def lone_rank_step() -> float:
    result = compare_strategies(1, model=MODEL, steps=STEPS, batch_per_rank=BATCH, strategies=("local",),
                                backend="gloo", device="cpu")
    return result["rows"][0]["step_time_s"]


def main() -> int:
    plain, rank = [], []
    for _ in range(ROUNDS):
        plain.append(plain_process_step())
        rank.append(lone_rank_step())
    report = {"model": MODEL, "batch_per_rank": BATCH, "steps": STEPS, "threads": cores_available(),
              "plain_step_s": plain, "rank_step_s": rank,
              "ratio": statistics.median(rank) / statistics.median(plain), "bar": 1.5}
    RESULTS.mkdir(exist_ok=True)
    record = {"command": "python benchmarks/lone_rank.py", "machine": machine(), "report": report}
    (RESULTS / "lone_rank_cpu.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"lone rank / plain process, median step: {report['ratio']:.2f} (bar: at most {report['bar']})")
    return 0 if report["ratio"] <= report["bar"] else 1


if __name__ == "__main__":
    os.environ.setdefault("DPTEACH_GPUS", "0")
    sys.exit(main())
