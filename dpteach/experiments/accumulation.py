"""``accumulation_sweep``: what gradient accumulation buys, what it costs, and two ways to get it wrong.

With K micro-batches of B samples on each of W ranks, one optimizer step averages B x W x K samples
and sends the gradient once. So, as K grows:

* communication per *sample* falls as 1/K (one message per step, the same size whatever K is);
* the effective batch grows to B x W x K - which changes the optimisation unless the learning rate
  schedule is adapted (Goyal et al., "Accurate, Large Minibatch SGD", 2017);
* the stall is *deferred*, not removed: the ranks still wait for the all-reduce after the last
  micro-batch of every step;
* the result equals single-process training on the large batch, up to float32 rounding.

And the two classic bugs, measured on real ranks:

* deciding ``no_sync()`` after forward: DDP arms its reducer during forward, so a backward run
  inside ``no_sync()`` entered too late still all-reduces every bucket (counted with a comm hook);
* forgetting to divide each micro-batch's loss by K: the accumulated gradient is K times the
  large-batch gradient - for SGD, a K times larger learning rate.

Everything runs in ONE world: the sweep (each K next to a ``local`` run with the same compute, so
that exposed communication is step time minus compute floor) and the bug demonstrations.
"""
from __future__ import annotations

from dataclasses import replace

import torch
import torch.distributed as dist
from torch.nn.utils import parameters_to_vector

from .. import validate

from ..ranks import context
from ..ranks.world import World
from ..replica.data import global_batches, loss_fn, make_dataset, rank_microbatches, sample_batch
from ..replica.models import SPECS, build_model
from ..replica.sizing import RunLoad
from ..replica.trace import save_trace
from ..training.accounting import summarise_run, typical_step
from ..training.reference import exact_tolerance, train_single_process
from ..training.train import TrainConfig, train_each_on_rank
from ..training.prologue import set_up

# Two float32 gradients computed in different summation orders agree to about 1e-7 relative per
# addition; over a few hundred samples a relative 1e-5 of the largest entry leaves ample room while
# still catching a missing 1/K or 1/W (errors of 50% and more).
GRADIENT_RTOL = 1e-5


def _averaged_gradient(model, dataset, criterion, micro_batches, divide_by_k: bool) -> torch.Tensor:
    """Accumulate this rank's micro-batches, then average over ranks; return the flat gradient."""
    device = context.device()
    model.zero_grad()
    for indices in micro_batches:
        x, y = (t.to(device) for t in sample_batch(dataset, indices))
        loss = criterion(model(x), y)
        (loss / len(micro_batches) if divide_by_k else loss).backward()
    flat = parameters_to_vector([p.grad for p in model.parameters()]).detach()
    dist.all_reduce(flat)
    return (flat / dist.get_world_size()).cpu()


def _count_ddp_all_reduces(model_name, dataset, criterion, micro_batches, decide_after_forward: bool, seed: int):
    """All-reduces DDP launches for one step of K micro-batches, with ``no_sync`` entered before or after forward."""
    from ..sync.ddp import wrap_ddp
    device = context.device()
    model = build_model(model_name, seed=seed).to(device)
    ddp = wrap_ddp(model)
    calls = []

    def counting_hook(state, bucket):  # what DDP's default hook does, plus counting
        tensor = bucket.buffer()
        calls.append(tensor.numel() * tensor.element_size())
        tensor.div_(dist.get_world_size())
        return dist.all_reduce(tensor, async_op=True).get_future().then(lambda fut: fut.value()[0])
    ddp.register_comm_hook(None, counting_hook)
    k = len(micro_batches)
    for i, indices in enumerate(micro_batches):
        x, y = (t.to(device) for t in sample_batch(dataset, indices))
        if i == k - 1:  # the last micro-batch must communicate
            (criterion(ddp(x), y) / k).backward()
        elif decide_after_forward:
            loss = criterion(ddp(x), y) / k  # forward has already armed the reducer...
            with ddp.no_sync():  # ...so entering no_sync now is too late
                loss.backward()
        else:
            with ddp.no_sync():
                (criterion(ddp(x), y) / k).backward()
    grad = parameters_to_vector([p.grad for p in model.parameters()]).detach().cpu()
    return {"all_reduces": len(calls), "bytes": sum(calls), "grad": grad}


def _bug_demos(model_name: str, k: int, batch_per_rank: int, seed: int) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    dataset = make_dataset(model_name, batch_per_rank * world * k, seed=seed)
    criterion = loss_fn(model_name)
    batch = next(global_batches(dataset, batch_per_rank, world, k, seed))
    mine = rank_microbatches(batch, rank, world, batch_per_rank, k)
    model = build_model(model_name, seed=seed).to(context.device())
    right = _averaged_gradient(model, dataset, criterion, mine, divide_by_k=True)
    forgot = _averaged_gradient(model, dataset, criterion, mine, divide_by_k=False)
    before = _count_ddp_all_reduces(model_name, dataset, criterion, mine, False, seed)
    after = _count_ddp_all_reduces(model_name, dataset, criterion, mine, True, seed)
    out = {"no_sync_before_forward": {k_: v for k_, v in before.items() if k_ != "grad"},
           "no_sync_after_forward": {k_: v for k_, v in after.items() if k_ != "grad"},
           "late_no_sync_grad_diff": (before["grad"] - after["grad"]).abs().max().item()}
    if rank == 0:
        out.update(global_batch=batch, grad_divided=right, grad_not_divided=forgot)
    return out


def _on_rank(configs, model_name, bug_k, batch_per_rank, seed):
    runs = train_each_on_rank(configs, True)  # interleaved: every K sees the same background load
    return {"runs": runs, "bugs": _bug_demos(model_name, bug_k, batch_per_rank, seed) if model_name else None}


def large_batch_gradient(model_name: str, dataset_size: int, indices, seed: int) -> torch.Tensor:
    """The reference: one process, one model, one backward over the whole global batch."""
    model = build_model(model_name, seed=seed)
    dataset = make_dataset(model_name, dataset_size, seed=seed)
    x, y = sample_batch(dataset, indices)
    loss_fn(model_name)(model(x), y).backward()
    return parameters_to_vector([p.grad for p in model.parameters()]).detach()


BUG_BATCH = 16  # the bug demonstrations are about correctness: a laptop model at this batch shows them anywhere


def accumulation_sweep(world_size: int | World | None = None, accum_steps_list=(1, 2, 4), model: str = "auto",
                       steps: int = 6, batch_per_rank: int | None = None, strategy: str = "bucketed",
                       bucket_mb: float | None = None, seed: int = 0, link=None, backend: str = "auto",
                       device: str = "auto", timeout: float = 600.0, peers: str | None = None, trace=None) -> dict:
    """Train with each K in ``accum_steps_list``; measure communication, time and equivalence; show the bugs.

    ``link``: an emulated network for the training runs' collectives (``dpteach.network.emulated``); the two bug
    demonstrations count bytes and calls, which no link changes, and run without one, on the laptop model
    (the MLP when a GPU-sized model trains: they are about correctness, not speed).
    ``model="auto"``: the MLP on CPU ranks, a GPU-sized transformer on GPU ranks (``dpteach.replica.sizing``);
    ``batch_per_rank=None``: 16 for a laptop model, the model's own for a GPU-sized one.
    ``peers="emulated"``: one real rank, its exchange timed as among ``world_size`` (``dpteach.ranks.world``);
    equivalence is then not shown and the bug demonstrations, which need real ranks, do not run (None).
    ``trace``: a file to write every run's whole timeline to, for Perfetto (``dpteach/replica/trace.py``).

    Returns ``{"world_size", "backend", "device", "model", "model_choice", "peers", "strategy", "link",
    "batch_per_rank", "steps", "tolerance", "rows": [one per K], "timelines": {K: {rank: spans of one
    typical step}}, "trace": the file written or None, "no_sync": {...}, "loss_not_divided": {...}}`` - see the notebook for each field in use.
    """
    ks = sorted({int(k) for k in accum_steps_list})
    if not ks or ks[0] < 1:
        raise ValueError(f"accum_steps_list={accum_steps_list!r} is not allowed: give integers >= 1")
    if strategy not in ("naive", "bucketed", "overlap", "ddp"):
        raise ValueError(f"strategy={strategy!r} is not allowed: choose an exact one (naive, bucketed, overlap, ddp)")
    validate.optional(validate.integer, "batch_per_rank", batch_per_rank, low=1)
    setup = set_up(world_size, backend, device, peers, model=model, link=link, emulated_peers_ok=True,
                   load=lambda world: RunLoad(steps=sum(2 * steps * k for k in ks) + (
                       sum(steps * world.size * k for k in ks) if world.emulated_size is None else 0),
                       models_at_once=2 * len(ks), cpu_model="mlp", batch_per_rank=16))
    world, emulated, real, choice = setup.world, setup.link, setup.real, setup.choice
    base = TrainConfig(**setup.fields(batch_per_rank), strategy=strategy, steps=steps, bucket_mb=bucket_mb, seed=seed)
    configs = []
    for k in ks:
        configs += [replace(base, strategy="local", accum_steps=k).check(world),
                    replace(base, accum_steps=k).check(world)]
    bug_k = max(2, ks[-1])
    bug_model = choice.name if SPECS[choice.name].sized_for == "cpu" else "mlp"
    per_rank = setup.on_ranks(_on_rank, configs, bug_model if real else None, bug_k, BUG_BATCH, seed, timeout=timeout)
    timed = range(min(base.timing_warmup, steps - 1), steps)
    rows, timelines, traced = [], {}, {}
    for i, k in enumerate(ks):
        floor = [per_rank[r]["runs"][2 * i] for r in range(world.size)]
        runs = [per_rank[r]["runs"][2 * i + 1] for r in range(world.size)]
        floor_summary = summarise_run(floor, timed)
        summary = summarise_run(runs, timed, floor_summary["step_time_s"], strategy)
        reference = (train_single_process(configs[2 * i + 1], world.size, device=setup.reference_device)
                     if real else None)
        samples = configs[2 * i + 1].global_batch(world.timed_size)
        exposed = summary["exposed_comm_s"]
        rows.append({
            "accum_steps": k, "effective_batch": samples, "messages_per_step": summary["messages"],
            "bytes_per_step": summary["bytes_per_step"], "bytes_per_sample": summary["bytes_per_step"] / samples,
            "step_time_s": summary["step_time_s"], "compute_floor_s": floor_summary["step_time_s"],
            "exposed_comm_s": exposed, "exposed_comm_per_sample_s": exposed / samples,
            "overhead_s": summary["overhead_s"], "overhead_parts": summary["overhead_parts"],
            "comm_after_last_forward": all(_comm_waits_for_last_micro_batch(r["spans"], s) for r in runs for s in timed),
            "max_abs_diff_vs_large_batch": (runs[0]["params"] - reference["params"]).abs().max().item() if real else None,
            "replicas_identical": summary["replicas_identical"], "time_set_by": summary["time_set_by"],
            # the timed steps as interleaved rounds (every K took its step s in turn): median and interval
            "spread": summary["spread"], "compute_floor_spread": floor_summary["spread"]["step_s"],
        })
        shown = typical_step(runs[0]["step_times"], timed)
        timelines[k] = {r: [s for s in runs[r]["spans"] if s["step"] == shown] for r in range(world.size)}
        traced.update({f"local K={k}": floor, f"{strategy} K={k}": runs})
    facts = {**setup.facts, "strategy": strategy, "link": None if emulated is None else emulated.as_dict(),
             "batch_per_rank": base.batch_per_rank, "steps": steps, "tolerance": exact_tolerance(base), "rows": rows,
             "timelines": timelines, "trace": save_trace(trace, traced, world.device_type, setup.facts)}
    if not real:
        return {**facts, "no_sync": None, "loss_not_divided": None}
    bugs = per_rank[0]["bugs"]
    dataset_size = BUG_BATCH * world.size * bug_k
    big = large_batch_gradient(bug_model, dataset_size, bugs["global_batch"], seed)
    scale = big.abs().max().item()
    forgot, right = bugs["grad_not_divided"], bugs["grad_divided"]
    loss_bug = {
        "k": bug_k, "model": bug_model, "grad_norm_large_batch": big.norm().item(), "grad_norm_divided": right.norm().item(),
        "grad_norm_not_divided": forgot.norm().item(), "norm_ratio": (forgot.norm() / big.norm()).item(),
        "max_abs_diff_divided": (right - big).abs().max().item(),
        "max_abs_diff_not_divided_over_k": (forgot / bug_k - big).abs().max().item(),
        "gradient_tolerance": GRADIENT_RTOL * scale,
    }
    no_sync = {"k": bug_k, "model": bug_model, "before_forward": bugs["no_sync_before_forward"],
               "after_forward": bugs["no_sync_after_forward"],
               "late_no_sync_grad_diff": max(per_rank[r]["bugs"]["late_no_sync_grad_diff"] for r in range(world.size))}
    return {**facts, "no_sync": no_sync, "loss_not_divided": loss_bug}


def _comm_waits_for_last_micro_batch(spans: list[dict], step: int) -> bool:
    """True when every transfer of ``step`` starts after the last micro-batch's forward began."""
    mine = [s for s in spans if s["step"] == step]
    forwards = sorted(s["start"] for s in mine if s["name"] == "forward")
    comm = [s["start"] for s in mine if s["lane"] == "comm"]
    return bool(comm) and bool(forwards) and min(comm) >= forwards[-1]
