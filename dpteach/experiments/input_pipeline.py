"""``input_pipeline``: a slow loader starves the ranks; prefetching and worker processes feed them again.

Every rank reads its own shard through a real ``torch.utils.data.DataLoader`` with the course's
``ShardedSampler`` and trains with torch DDP. The dataset's ``__getitem__`` *sleeps* ``decode_ms``
per sample: it stands for I/O-like work (reading and decoding a JPEG from disk) that waits rather
than computes. That is why worker processes help even on a 2-core laptop - a sleeping worker uses no
core - while CPU-heavy augmentation would need free cores as well.

Per step, each rank measures the time blocked in ``next(batch)`` (*data wait*), the rest of the step
(*compute*: forward, backward with DDP's all-reduce, optimizer) and their sum; the *idle fraction*
wait / step is the share of time the accelerator would sit idle. The configurations:

* ``num_workers=0``: the training process decodes every batch itself, so the decode time is added to
  every step;
* a background thread that keeps ``thread_prefetch`` batches ready (sleep releases the GIL, so one
  thread overlaps decoding with compute);
* ``num_workers=N`` with ``prefetch_factor``: N processes decode batches in parallel, ahead of time;
* ``pin_memory=True``: page-locked host buffers make host-to-GPU copies faster and asynchronous
  (``non_blocking=True``). It only means something with CUDA: on a CPU-only rank it is skipped and
  the result says so (``pin_memory_effective: False``);
* ``set_epoch=False``: the forgotten ``sampler.set_epoch(epoch)`` - every epoch repeats epoch 0's
  order, which the recorded sample order shows.

Workers are started with ``persistent_workers=False`` (new ones each epoch: their start-up shows as a
longer wait on an epoch's first batch) and with the ``fork`` start method on Linux. Measured inside a
rank on a busy 2-core machine, the first batch of an epoch took about 0.1 s with ``fork``, 4 s with
``forkserver`` and 7-9 s with ``spawn``, which re-imports torch in every worker. Each iterator is shut down before the next epoch, and every rank reports how many child
processes it still has at the end (0: nothing leaked).

The configurations run one after another, not interleaved step by step: a loader's workers prefetch while
the process does anything else, so stepping another loader between two of its steps would hand it free
time and flatter it. What keeps the comparison honest instead is a floor no machine can lower: the sleep.
A synchronous step waits at least the decode time of a batch, so a loader whose steady wait lies wholly
below that floor (``wait_spread``: the steady steps as rounds, ``dpteach.measure``) hid part of it, beyond
the noise, however busy the machine was during the synchronous run.
"""
from __future__ import annotations

import multiprocessing
import queue
import statistics
import sys
import threading
import time
import warnings

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

from .. import validate
from ..measure import spread

from ..ranks import context
from ..ranks.launcher import launch
from ..ranks.world import World, resolve_world
from ..replica.data import ShardedSampler, loss_fn, make_dataset
from ..replica.models import build_model
from ..replica.timeline import Timeline, start_together
from ..replica.trace import save_trace
from ..sync import make_strategy


def standard_loader_configs(num_workers: int = 2, prefetch_factor: int = 2, thread_prefetch: int = 2) -> list[dict]:
    """The lesson's standard set of loader configurations (see the module note)."""
    workers = {"num_workers": num_workers, "prefetch_factor": prefetch_factor}
    return [
        {"name": "num_workers=0 (synchronous)", "num_workers": 0},
        {"name": f"background thread, {thread_prefetch} batches ahead", "num_workers": 0,
         "thread_prefetch": thread_prefetch},
        {"name": f"num_workers={num_workers}, prefetch_factor={prefetch_factor}", **workers},
        {"name": f"num_workers={num_workers} + pin_memory", **workers, "pin_memory": True},
        {"name": f"num_workers={num_workers}, set_epoch forgotten", **workers, "set_epoch": False},
    ]


_KEYS = {"name", "num_workers", "prefetch_factor", "pin_memory", "thread_prefetch", "set_epoch"}


def check_loader_config(config: dict) -> dict:
    """Fill defaults and refuse what a DataLoader would refuse, before any rank starts."""
    if not isinstance(config, dict) or set(config) - _KEYS:
        raise ValueError(f"loader config {config!r} is not allowed: use a dict with keys from {sorted(_KEYS)}")
    full = {"name": None, "num_workers": 0, "prefetch_factor": None, "pin_memory": False, "thread_prefetch": 0,
            "set_epoch": True, **config}
    for key in ("num_workers", "thread_prefetch"):
        validate.integer(key, full[key], low=0)
    if full["prefetch_factor"] is not None and full["num_workers"] == 0:
        raise ValueError(f"prefetch_factor={full['prefetch_factor']!r} with num_workers=0 is not allowed: "
                         f"only worker processes prefetch (torch's DataLoader refuses it too)")
    full["name"] = full["name"] or f"num_workers={full['num_workers']}"
    return full


class SlowDecodeDataset(Dataset):
    """The model's synthetic samples, each costing ``decode_ms`` of waiting to "decode"; items carry their index."""

    def __init__(self, model: str, num_samples: int, decode_ms: float, seed: int = 0):
        self.data = make_dataset(model, num_samples, seed=seed)
        self.decode_s = decode_ms / 1e3

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int):
        if self.decode_s > 0:
            time.sleep(self.decode_s)
        x, y = self.data[index]
        return x, y, index


class ThreadPrefetcher:
    """Iterates ``iterable`` on a background thread, keeping up to ``depth`` items ready in a queue."""

    _END = object()

    def __init__(self, iterable, depth: int = 2):
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._fill, args=(iterable,), daemon=True)
        self.thread.start()

    def _put(self, item) -> bool:
        while not self.stopping.is_set():
            try:
                self.queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _fill(self, iterable) -> None:
        try:
            for item in iterable:
                if not self._put(item):
                    return
        except BaseException as exc:  # hand the error to the consumer instead of losing it
            self._put(exc)
        self._put(self._END)

    def __iter__(self):
        return self

    def __next__(self):
        item = self.queue.get()
        if item is self._END:
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=10)


def _start_method():
    """``fork`` where it is the safe, fast choice (Linux); the platform's default elsewhere."""
    return "fork" if sys.platform.startswith("linux") else None


def _train_with_loader(config: dict, model_name: str, steps_per_epoch: int, epochs: int, batch: int,
                       decode_ms: float, seed: int, bucket_mb: float) -> dict:
    rank, world, device = dist.get_rank(), dist.get_world_size(), context.device()
    pin = bool(config["pin_memory"]) and device.type == "cuda"
    dataset = SlowDecodeDataset(model_name, steps_per_epoch * batch * world, decode_ms, seed)
    sampler = ShardedSampler(len(dataset), world, rank, shuffle=True, seed=seed)
    workers = config["num_workers"]
    # torch warns when the workers outnumber the cores it suggests (two ranks' workers on a 2-core laptop): the
    # lesson asks for them on purpose and says what they cost there; the warning would only print a file path
    warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
    loader = DataLoader(dataset, batch_size=batch, sampler=sampler, drop_last=True, num_workers=workers,
                        prefetch_factor=config["prefetch_factor"] if workers else None, pin_memory=pin,
                        persistent_workers=False, multiprocessing_context=_start_method() if workers else None)
    model = build_model(model_name, seed=seed).to(device)
    timeline = Timeline(device)
    strategy = make_strategy("ddp", model, timeline, bucket_mb)
    module, criterion = strategy.wrap(), loss_fn(model_name)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    waits, computes, orders, step = [], [], [], 0
    start_together(timeline)
    for epoch in range(epochs):
        if config["set_epoch"]:
            sampler.set_epoch(epoch)
        source = iter(loader)
        batches = ThreadPrefetcher(source, config["thread_prefetch"]) if config["thread_prefetch"] else source
        seen = []
        try:
            for _ in range(steps_per_epoch):
                strategy.start_step(step)
                start = timeline.now()
                x, y, index = next(batches)
                got = timeline.now()
                timeline.add(step, "data", start, got)
                seen += index.tolist()
                x, y = x.to(device, non_blocking=pin), y.to(device, non_blocking=pin)
                with timeline.span(step, "forward"):
                    loss = criterion(module(x), y)
                with timeline.span(step, "backward"):
                    loss.backward()
                with timeline.span(step, "optimizer"):
                    optimizer.step()
                    optimizer.zero_grad()
                context.synchronize()
                timeline.resolve()
                waits.append(got - start)
                computes.append(timeline.now() - got)
                step += 1
                if rank == 0:
                    context.report_progress(1)
        finally:
            if batches is not source:
                batches.close()
            del batches, source  # shuts the epoch's worker processes down now, not at garbage collection
        orders.append(seen)
    dist.barrier()
    return {"name": config["name"], "waits": waits, "computes": computes, "orders": orders,
            "epoch_first_steps": [e * steps_per_epoch for e in range(epochs)], "pin_memory_effective": pin,
            "spans": timeline.spans, "clock_origin_s": timeline.origin, "children_left": len(multiprocessing.active_children())}


def _on_rank(configs, model_name, steps_per_epoch, epochs, batch, decode_ms, seed, bucket_mb):
    if context.rank() == 0:
        context.report_progress(0, total=len(configs) * steps_per_epoch * epochs, desc="loader configurations")
    return [_train_with_loader(c, model_name, steps_per_epoch, epochs, batch, decode_ms, seed, bucket_mb)
            for c in configs]


def _summarise(ranks: list[dict], batch: int, decode_ms: float) -> dict:
    first = set(ranks[0]["epoch_first_steps"])
    steady = [w for r in ranks for i, w in enumerate(r["waits"]) if i not in first]
    wait_total = sum(sum(r["waits"]) for r in ranks)
    step_total = sum(sum(r["waits"]) + sum(r["computes"]) for r in ranks)
    steady_steps = [w + c for r in ranks for i, (w, c) in enumerate(zip(r["waits"], r["computes"])) if i not in first]
    orders = [r["orders"] for r in ranks]  # [rank][epoch] -> sample indices
    epochs = len(orders[0])
    # the steady steps as the rounds of a measurement: each step's wait averaged over the ranks, then the
    # median and its interval (dpteach.measure)
    rounds = [i for i in range(len(ranks[0]["waits"])) if i not in first] or [0]
    return {
        "name": ranks[0]["name"],
        "wait_spread": spread([statistics.mean(r["waits"][i] for r in ranks) for i in rounds]).as_dict(),
        "median_wait_s": statistics.median(steady) if steady else statistics.median(ranks[0]["waits"]),
        "first_batch_wait_s": statistics.mean(r["waits"][i] for r in ranks for i in first),
        "median_compute_s": statistics.median(c for r in ranks for c in r["computes"]),
        "median_step_s": statistics.median(w + c for r in ranks for w, c in zip(r["waits"], r["computes"])),
        "idle_fraction": wait_total / step_total,
        "steady_idle_fraction": sum(steady) / sum(steady_steps) if steady_steps else wait_total / step_total,
        "decode_per_batch_s": batch * decode_ms / 1e3,
        "pin_memory_effective": ranks[0]["pin_memory_effective"],
        "epoch_orders_repeat": all(o[e] == o[0] for o in orders for e in range(1, epochs)),
        "shards_disjoint": all(len({i for o in orders for i in o[e]}) == sum(len(o[e]) for o in orders)
                               for e in range(epochs)),
        "children_left": sum(r["children_left"] for r in ranks),
        "waits_rank0": ranks[0]["waits"], "computes_rank0": ranks[0]["computes"], "orders_rank0": ranks[0]["orders"],
    }


def input_pipeline(world_size: int | World | None = None, loader_configs: list[dict] | None = None, steps: int = 16,
                   decode_ms: float = 1.5, num_workers: int = 2, prefetch_factor: int = 2, epochs: int = 2,
                   batch_per_rank: int = 32, model: str = "mlp", seed: int = 0, bucket_mb: float = 25.0,
                   backend: str = "auto", device: str = "auto", timeout: float = 600.0, trace=None) -> dict:
    """Train about ``steps`` steps (over ``epochs`` epochs) behind each loader configuration; return measurements.

    ``loader_configs``: dicts with keys name, num_workers, prefetch_factor, pin_memory, thread_prefetch,
    set_epoch; default ``standard_loader_configs(num_workers, prefetch_factor)``. Returns
    ``{"world_size", "backend", "device", "model", "decode_ms", "batch_per_rank", "steps_per_epoch", "epochs",
    "rows": [one per configuration], "spans": {name: {rank: spans}}, "trace"}``; times in seconds. ``trace``: a
    file to write every configuration's timeline to, for Perfetto (``dpteach/replica/trace.py``).
    """
    world = resolve_world(world_size, backend, device)
    configs = [check_loader_config(c) for c in (loader_configs if loader_configs is not None
                                                 else standard_loader_configs(num_workers, prefetch_factor))]
    for name, value in (("steps", steps), ("epochs", epochs), ("batch_per_rank", batch_per_rank)):
        validate.integer(name, value, low=1)
    validate.number("decode_ms", decode_ms, low=0, unit="a number of milliseconds")
    steps_per_epoch = max(1, steps // epochs)
    per_rank = launch(_on_rank, world,
                      args=(configs, model, steps_per_epoch, epochs, batch_per_rank, float(decode_ms), seed, bucket_mb),
                      timeout=timeout)
    rows, spans = [], {}
    for i, config in enumerate(configs):
        ranks = [per_rank[r][i] for r in range(world.size)]
        rows.append({**_summarise(ranks, batch_per_rank, decode_ms), "config": config})
        spans[config["name"]] = {r: ranks[r]["spans"] for r in range(world.size)}
    return {"world_size": world.size, "backend": world.backend, "device": world.device_type,
            "model": model, "decode_ms": float(decode_ms), "batch_per_rank": batch_per_rank,
            "steps_per_epoch": steps_per_epoch, "epochs": epochs, "rows": rows, "spans": spans,
            "trace": save_trace(trace, {config["name"]: [per_rank[r][i] for r in range(world.size)]
                                        for i, config in enumerate(configs)}, world.device_type,
                                {"model": model, "world_size": world.size, "backend": world.backend})}
