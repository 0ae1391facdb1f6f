"""Lesson 09: does W times the ranks give W times the throughput?

``scaling_sweep`` trains the same model with a fixed per-rank batch (weak scaling) at several
world sizes, one launch per W, and in each world it runs two things: ``local`` (the same per-rank
work with no communication: the compute floor at this W) and the strategy under study. Then

* throughput(W) = W x batch_per_rank / step time (samples per second, all ranks together);
* efficiency(W) = throughput(W) / (W x throughput(1)) - 1.0 is perfect linear scaling;
* the step is broken down from the strategy's own timeline: forward, backward, optimizer, the
  wait for the last all-reduces (synchronisation), and the rest of the step (fetching the batch,
  bookkeeping); and exposed communication, the time the step waited for communication, measured
  (``timeline.exposed_time``).

Each world also measures its link (``bench.link_on_rank``) so that ``dpteach.network.scaling`` can
extrapolate from this machine's own alpha, beta and compute time.

On a laptop the ranks share the CPU cores: once W exceeds the cores, ranks take turns, and the
"scaling" measured is the machine running out of cores, not the algorithm failing. The same holds
on a machine with fewer GPUs than the largest W: the sweep then runs every W with gloo (one
placement for the whole sweep, so that it compares world sizes, not transports) and the ranks
time-slice the GPUs. The result says so (``oversubscribed``, ``sharing``) and the notebook explains it. Each rank computes with one thread by
default (``threads_per_rank=1``), so that W ranks ask for W cores, as W GPUs would be W devices: if
the single rank of W=1 used every core, W=2 would start by halving each rank's compute, and a
multi-threaded rank on a busy machine can stall badly when one of its threads loses its core.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from .. import validate
from ..network import scaling as simulator
from ..network.link import PRESETS, resolve_link
from ..ranks import context
from ..ranks.backend import choose_placement, cores_available
from ..ranks.launcher import launch
from ..ranks.world import PEERS, World
from ..replica.models import build_model
from ..replica.sizing import RunLoad, check_model, choose_model, run_facts
from ..sync import STRATEGIES, strategy_class
from ..training.train import TrainConfig, train_interleaved_on_rank
from .bench import link_on_rank
from .scaling_rows import add_efficiencies, breakdown, throughput_ranking, world_row


def _scaling_on_rank(configs: list[TrainConfig], repeats: int, threads: int | None, search=None) -> dict:
    if threads is not None:
        torch.set_num_threads(threads)
    rank = context.rank()
    if rank == 0:
        context.report_progress(0, total=1 + repeats, desc=f"W={context.world_size()}")
    link = link_on_rank() if configs[0].timed_world_size is None else None  # emulated: the link's
    if rank == 0:
        context.report_progress(1)
    runs = [[] for _ in configs]
    for _ in range(repeats):  # every config side by side, step by step: the same conditions for all
        for i, out in enumerate(train_interleaved_on_rank(configs)):
            runs[i].append({"median_step_s": out["median_step_s"], "final_loss": out["losses"][-1],
                            "link": out["link"], "step_times": out["step_times"], "warmup": configs[i].timing_warmup,
                            "breakdown": breakdown(out["spans"], out["step_times"], configs[i].timing_warmup)})
        if rank == 0:
            context.report_progress(1)
    found = None
    if search is not None:  # lesson 09's steps to target, in this world rather than one started for them
        from .batch_runs import search_on_rank
        found = search_on_rank(*search)
    return {"link": link, "runs": runs, "search": found}


SCALINGS = ("weak", "strong")


def scaling_sweep(world_sizes=(1, 2, 3, 4), model: str = "auto", steps: int = 10, strategy: str = "overlap",
                  batch_per_rank: int | None = None, bucket_mb: float | None = None, repeats: int = 2,
                  threads_per_rank: int | None = 1, scaling: str = "weak", global_batch: int | None = None,
                  link=None, backend: str = "auto", device: str = "auto", peers: str | None = None,
                  strong_too: bool = False, to_target: float | None = None, target_max_steps: int = 100) -> dict:
    """Throughput and scaling efficiency at each W, with the overheads split out.

    ``scaling="weak"`` keeps ``batch_per_rank`` fixed, so the global batch grows with W;
    ``scaling="strong"`` keeps the global batch fixed (``global_batch``, default ``batch_per_rank`` x
    the largest W) and gives each of the W ranks ``global_batch / W`` samples: the same work, shared
    by more ranks. ``link`` runs the strategy's collectives on an emulated network (``dpteach.network.emulated``).
    ``model="auto"``: the MLP on CPU ranks, a GPU-sized transformer on GPU ranks (``dpteach.replica.sizing``);
    ``batch_per_rank=None``: 32 for a laptop model, the model's own for a GPU-sized one.
    ``peers="emulated"``: every W > 1 is one real rank whose exchange the link times as among W
    (``dpteach.ranks.world``): the throughput is what W such ranks would reach if each computed what this one
    does, so the efficiency is the communication's alone.
    ``strong_too`` (weak scaling only): every world also runs strong scaling's configs (the global batch of
    the largest weak world, shared), step by step beside the weak ones, and the result carries that strong
    result under ``"strong"``: one launch per W for both, and at each W the two measured side by side. At the
    largest W the two configs are the same and run once.

    ``to_target`` (weak scaling of the MLP on real ranks, with W = 2 among the worlds): that world, once its
    steps are timed, also searches the steps to this target loss at every W's global batch (lesson 15's
    ``critical_batch`` search, ``target_max_steps`` at most), and the result carries it as ``"critical"`` for
    ``time_to_target_scaling``: the two-rank world it needs is one the sweep started anyway.

    Every step time is the median of all timed steps (``repeats`` passes of ``steps`` less two warm-up) with
    its interval (``dpteach.measure.spread``); efficiency and speed-up carry the interval that the two step
    times' intervals allow, and ``throughput`` ranks the worlds by time per sample, naming the fastest only
    when its interval separates from every other.

    Returns plain data::

        {"model", "strategy", "scaling", "backend", "device", "gpus" (one placement for every W: the
         largest world's), "global_batch" (strong only), "batch_per_rank", "cpus",
         "grad_bytes", "world_sizes",
         "emulated_link" (``Link.as_dict()`` of ``link``, or None when the collectives ran on this
         machine's own transport),
         "compute_s" (local step at W=1: the compute time the simulator starts from),
         "link": {"alpha_s", "beta_s_per_byte"} (measured at the largest W that has a link: what the
                  simulator extrapolates from),
         "rows": [{"world_size", "step_time_s", "local_step_s", "samples_per_s", "speedup",
                   "efficiency", "exposed_comm_s", "hidden_comm_s" (communication in flight while
                   the step computed), "overlap_fraction" (hidden / local step: the simulator's
                   ``overlap`` as this run achieved it), "breakdown": {forward, backward, optimizer,
                   wait, data_and_other, comm_busy}, "alpha_s", "beta_s_per_byte",
                   "oversubscribed" (more ranks than GPUs, or than cores on CPU), "sharing" (a
                   sentence saying how they share, or None), "final_loss", "batch_per_rank" (this W's), "time_set_by"}, ...]}
    """
    check_model(model)
    if peers is not None:
        validate.choice("peers", peers, PEERS)
    emulate = peers == "emulated"
    sizes = sorted({int(w) for w in world_sizes})
    if not sizes or sizes[0] != 1:
        raise ValueError(f"world_sizes={list(world_sizes)!r} is not allowed: include 1, the baseline every "
                         f"efficiency is measured against")
    validate.optional(validate.integer, "threads_per_rank", threads_per_rank, low=1,
                      why=", or None (the launcher's default: the cores shared out between the ranks)")
    validate.integer("repeats", repeats, low=1)
    validate.choice("strategy", strategy, STRATEGIES)
    if not (strategy_class(strategy).lockstep and strategy_class(strategy).communicates):
        raise ValueError(f"strategy={strategy!r} is not allowed here: choose a synchronous data-parallel "
                         f"strategy (overlap, bucketed, naive, ddp, ...)")
    validate.choice("scaling", scaling, SCALINGS)
    validate.optional(validate.integer, "batch_per_rank", batch_per_rank, low=1)
    # One placement for the whole sweep, chosen for its largest world: a sweep that switched from
    # NCCL to gloo when W outgrew the GPUs would compare two transports, not two world sizes. With
    # emulated peers every world is one real rank.
    placement = choose_placement(1 if emulate else sizes[-1], backend, device)
    validate.choice("strong_too", strong_too, (False, True))
    load = RunLoad(steps=len(sizes) * repeats * 2 * steps, models_at_once=2, cpu_model="mlp", batch_per_rank=32,
                   launches=len(sizes), link=resolve_link(link))
    choice = choose_model(model, World(sizes[-1], placement), load)
    batch_per_rank = batch_per_rank or choice.batch_per_rank
    if scaling == "strong":
        global_batch = batch_per_rank * sizes[-1] if global_batch is None else global_batch
        uneven = [w for w in sizes if isinstance(global_batch, bool) or not isinstance(global_batch, int)
                  or global_batch < w or global_batch % w]
        if uneven:
            raise ValueError(f"global_batch={global_batch!r} is not allowed: strong scaling splits it evenly, so it "
                             f"must be an integer divisible by every W (not by {uneven})")
    emulated = resolve_link(link)
    base = TrainConfig(model=choice.name, steps=steps, batch_per_rank=batch_per_rank, bucket_mb=bucket_mb,
                       timing_warmup=2, link=emulated)

    def world_of(w):
        asked = (placement.backend, placement.device_type)
        return World(1, placement, asked, emulated_size=w) if emulate and w > 1 else World(w, placement, asked)

    strong_global = batch_per_rank * sizes[-1]
    # The strong companion needs its global batch to split evenly at every W; where it does not, none is run.
    kinds = [scaling] + (["strong"] if strong_too and scaling == "weak"
                         and not any(strong_global % w for w in sizes) else [])

    def batch_of(kind, w):
        return (global_batch if scaling == "strong" else strong_global) // w if kind == "strong" else batch_per_rank

    def configs_for(w):
        """[local, strategy] per kind; a kind whose batch equals an earlier one's shares its configs."""
        configs, index = [], {}
        for kind in kinds:
            b = batch_of(kind, w)
            if b not in index:
                index[b] = len(configs)
                configs += [replace(base, strategy=name, batch_per_rank=b, timed_world_size=world_of(w).emulated_size)
                            .check(world_of(w)) for name in ("local", strategy)]
            index[kind] = index[b]
        return configs, index
    for w in sizes:
        configs_for(w)
    cpus = cores_available()
    rows = {kind: [] for kind in kinds}
    validate.optional(validate.number, "to_target", to_target, above=0)
    validate.integer("target_max_steps", target_max_steps, low=1)
    search_in = 2 if (to_target is not None and scaling == "weak" and choice.name == "mlp" and not emulate
                      and 2 in sizes and batch_per_rank % 2 == 0) else None  # else time_to_target starts its own
    searched = None
    for w in sizes:
        configs, index = configs_for(w)
        world = world_of(w)
        search = ([v * batch_per_rank for v in sizes], to_target, target_max_steps, 0.01) if w == search_in else None
        ranks = launch(_scaling_on_rank, world, args=(configs, repeats, threads_per_rank, search), timeout=600)
        searched = ranks[0]["search"] if search else searched
        for kind in kinds:
            rows[kind].append(world_row(ranks, index[kind], configs[index[kind] + 1], w, world, placement, emulated))
    grad_bytes = sum(p.numel() * p.element_size() for p in build_model(choice.name, device="meta").parameters()
                     if p.requires_grad)
    facts = run_facts(world_of(sizes[-1]), choice)
    results = {}
    for kind in kinds:
        add_efficiencies(rows[kind])
        # The link the simulator extrapolates from: the largest world that still had a core per rank.
        with_link = [r for r in rows[kind] if r["world_size"] > 1]
        fair = [r for r in with_link if not r["oversubscribed"]]
        link = fair[-1] if fair else (with_link[0] if with_link else rows[kind][0])
        results[kind] = {
            "model": choice.name, "model_choice": choice.as_dict(), "peers": facts["peers"],
            "peers_note": facts["peers_note"], "strategy": strategy, "scaling": kind, "backend": placement.backend,
            "device": placement.device_type, "gpus": placement.gpus,
            "global_batch": batch_of(kind, 1) if kind == "strong" else None,
            "emulated_link": None if emulated is None else emulated.as_dict(),
            "batch_per_rank": batch_per_rank, "bucket_mb": base.bucket_mb, "steps": steps, "repeats": repeats,
            "cpus": cpus, "grad_bytes": grad_bytes, "world_sizes": sizes, "compute_s": rows[kind][0]["local_step_s"],
            "link": {"alpha_s": link["alpha_s"], "beta_s_per_byte": link["beta_s_per_byte"],
                     "world_size": link["world_size"], "overlap_fraction": link.get("overlap_fraction", 0.0)},
            "rows": rows[kind], "throughput": throughput_ranking(rows[kind])}
    result = results[scaling]
    if searched is not None:
        from .batch_runs import critical_result
        result["critical"] = critical_result(searched, 2, to_target, target_max_steps)
    if len(kinds) > 1:
        result["strong"] = {**results["strong"], "measured_with": "weak"}
    return result


def strong_scaling(weak: dict, model: str = "auto", link=None, steps: int | None = None, **options) -> dict:
    """Lesson 09's strong-scaling panel: the strong result that ``weak`` (a ``scaling_sweep(strong_too=True)``
    result) measured beside its weak runs when ``model`` and ``link`` are the ones it ran with, else a new
    ``scaling_sweep(scaling="strong")`` over the same worlds, strategy and global batch (``options`` go to it)."""
    companion = weak.get("strong")
    asked = resolve_link(link)
    same_link = (None if asked is None else asked.as_dict()) == weak.get("emulated_link")
    if companion and model == weak["model"] and same_link and steps in (None, weak.get("steps")):
        return companion
    return scaling_sweep(world_sizes=tuple(weak["world_sizes"]), model=model, steps=steps or weak.get("steps", 8),
                         strategy=weak["strategy"], scaling="strong",
                         global_batch=weak["batch_per_rank"] * max(weak["world_sizes"]), link=link,
                         peers=weak.get("peers"), **options)


def scaling_simulation(compute_ms: float = 200.0, grad_mb: float = 2000.0, overlap: float = 0.6,
                       algorithm: str = "ring", bucket_mb: float | None = 25.0, max_world_size: int = 4096,
                       links=("nvlink", "ib_8nics"), measured_link: dict | None = None) -> dict:
    """Extrapolate one training step to W = 1, 2, 4, ... ``max_world_size`` with ``dpteach.network.scaling``.

    ``links`` names presets of :data:`dpteach.network.PRESETS`; ``measured_link`` (``{"alpha_s",
    "beta_s_per_byte"}``, e.g. ``scaling_sweep(...)["link"]``) adds this machine's own link.
    Pure arithmetic, instant. Returns ``{"curves": {link label: [predict_step rows]}, "names": [each
    curve's link name, in order], "title",
    "max_world_size", ...inputs}``.
    """
    validate.integer("max_world_size", max_world_size, low=2)
    chosen = [PRESETS[name] for name in validate.choices("links", links, PRESETS, at_least=0)]
    if measured_link is not None:
        chosen.insert(0, resolve_link({**measured_link, "name": "this machine", "source": "measured here"},
                                      "measured_link"))
    world_sizes = simulator.powers_of_two(max_world_size)
    bucket = None if bucket_mb is None else bucket_mb * 2**20
    curves = {}
    for link in chosen:
        curves[link.label] = simulator.simulate(world_sizes, compute_ms / 1e3, grad_mb * 2**20, link, overlap,
                                         algorithm, bucket)
    def num(v):
        return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"
    title = (f"compute {num(compute_ms)} ms/step, {num(grad_mb)} MiB of gradients, overlap {overlap:.0%}, {algorithm}"
             + (f", buckets of {num(bucket_mb)} MiB" if bucket_mb else ", one message"))
    return {"curves": curves, "names": [link.name for link in chosen], "title": title, "max_world_size": max_world_size, "compute_ms": compute_ms,
            "grad_mb": grad_mb, "overlap": overlap, "algorithm": algorithm, "bucket_mb": bucket_mb}
