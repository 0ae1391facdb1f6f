"""The training loop every lockstep strategy runs in, read top to bottom.

One optimizer step on W ranks with K micro-batches of B samples::

    global batch (B x W x K samples, the same on every rank: drawn from seed + epoch)
      -> rank r takes its K micro-batches of B          (dpteach.replica.data.rank_microbatches)
      -> for each micro-batch: forward, loss / K, backward   (sync decided before forward)
      -> strategy.finish(): every .grad is the mean over ranks
      -> optimizer.step()

The reference (``reference.py``) trains one model in one process on each whole global batch.
Because every loss is a mean over equal parts, the averaged data-parallel gradient is the
reference's gradient, so the exact strategies must end with the same weights up to float32
rounding (``reference.exact_tolerance`` says how close, and why).

A strategy that is not in lockstep (the parameter server, ``sync/async_ps.py``) brings its own
loop; :func:`train_on_rank` hands it the config and nothing else differs for the caller.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .. import validate

from ..measure import turned
from ..network.link import Link
from ..ranks import context
from ..replica.buckets import check_bucket_sizes
from ..replica.build import OPTIMIZERS, build_replica, make_optimizer, step_batches, summarise
from ..replica.data import sample_batch, split_for_rank
from ..replica.models import DEFAULT_BUCKET_MB, check_model_name, default_batch_per_rank
from ..replica.precision import PRECISIONS, Precision
from ..replica.timeline import Timeline, start_together
from ..sync import STRATEGIES, make_strategy, strategy_class

ALL_REDUCE_CHOICES = ("builtin", "ring", "tree")  # torch's own, or the course's (dpteach/collectives)


@dataclass
class TrainConfig:
    """One training run, as plain data that travels to the ranks; :meth:`check` it before they start."""

    strategy: str = "overlap"
    model: str = "mlp"
    steps: int = 20
    batch_per_rank: int | None = None  # None: the model's own (GPU-sized models), else 32
    accum_steps: int = 1
    bucket_mb: float | None = None  # None: the model's default (dpteach.replica.models.DEFAULT_BUCKET_MB)
    first_bucket_mb: float | None = None
    optimizer: str = "sgd"
    lr: float | None = None
    momentum: float = 0.9
    seed: int = 0
    num_samples: int | None = None  # default: exactly one epoch for all steps
    slow_rank: int | None = None  # a straggler: this rank sleeps slow_ms per step (async: per update)
    slow_ms: float = 0.0
    timing_warmup: int = 2  # steps left out of the median step time
    link: Link | None = None  # an emulated network (dpteach/network/emulated.py); None: this machine's own transfers
    all_reduce: str = "builtin"  # or the course's own "ring" / "tree" (dpteach/collectives), where a strategy takes it
    # Mixed precision (dpteach/replica/precision.py): the forward pass in "bf16" or "fp16" (fp16 with a dynamic loss
    # scale starting at init_scale, growing after growth_interval clean steps), clipping, and the dtype DDP's
    # gradients travel in ("grad_comm", a communication hook). unscale_before_clip=False is a mistake, on purpose.
    precision: str = "fp32"
    clip_norm: float | None = None
    init_scale: float = 2.0**16
    growth_interval: int = 2000
    unscale_before_clip: bool = True
    grad_comm: str = "fp32"
    # Data augmentation that draws random numbers: Gaussian noise of this standard deviation added to every
    # input, drawn from the rank's own torch generator (seeded seed + rank). The course's models have no
    # dropout (replica/models.py says why); this is what makes the generators' state part of a checkpoint.
    input_noise: float = 0.0
    # The chosen strategy's own options, by name (each strategy declares its knobs in its own file, with their
    # defaults and what is allowed: sync/knobs.py): {"powersgd_rank": 16}, {"sync_every": 32}. Only names the
    # strategy declares; the others take their defaults (``knob_values``).
    knobs: dict = field(default_factory=dict)
    # One real rank standing for a larger world whose peers the link emulates (dpteach/ranks/world.py): the size
    # of that world, which its strategy times and counts its messages for. None: the ranks are all real.
    timed_world_size: int | None = None

    def __post_init__(self):
        if self.bucket_mb is None:
            self.bucket_mb = DEFAULT_BUCKET_MB.get(self.model, 1.0)
        if self.batch_per_rank is None:
            self.batch_per_rank = default_batch_per_rank(self.model)

    def check(self, world) -> "TrainConfig":
        """Every option checked before any rank starts; a ValueError names option, value, what is allowed.
        ``world``: the number of ranks, or a resolved ``World`` (one with emulated peers is checked too)."""
        world_size = getattr(world, "size", world)
        validate.choice("strategy", self.strategy, STRATEGIES)
        check_model_name(self.model)
        for name, low in (("steps", 1), ("batch_per_rank", 1), ("accum_steps", 1), ("seed", 0), ("timing_warmup", 0)):
            validate.integer(name, getattr(self, name), low=low)
        check_bucket_sizes(self.bucket_mb, self.first_bucket_mb)
        validate.choice("optimizer", self.optimizer, OPTIMIZERS)
        validate.optional(validate.number, "lr", self.lr, above=0)
        validate.optional(validate.integer, "slow_rank", self.slow_rank, low=0, high=world_size - 1)
        if self.link is not None and not isinstance(self.link, Link):
            raise validate.refusal("link", self.link, "give a dpteach.network.Link (dpteach.network.resolve_link turns a "
                                                      "preset name into one) or None")
        validate.choice("all_reduce", self.all_reduce, ALL_REDUCE_CHOICES)
        validate.choice("precision", self.precision, PRECISIONS)
        validate.optional(validate.number, "clip_norm", self.clip_norm, above=0)
        validate.number("init_scale", self.init_scale, above=0)
        validate.integer("growth_interval", self.growth_interval, low=1)
        validate.choice("grad_comm", self.grad_comm, PRECISIONS)
        validate.number("input_noise", self.input_noise, low=0)
        if self.input_noise and self.model == "transformer":
            raise ValueError(f"input_noise={self.input_noise!r} is not allowed with model='transformer': its inputs "
                             f"are token ids, which noise cannot be added to; use 0.0, or the mlp or cnn")
        strategy_class(self.strategy).check(self, world_size)  # its knobs too
        emulated = getattr(world, "emulated_size", None)
        if emulated is not None:
            self._check_emulated_peers(world)
        if self.timed_world_size != emulated:
            raise validate.refusal("timed_world_size", self.timed_world_size, f"this world of {world_size} rank(s) "
                                   + (f"stands for {emulated}: give {emulated}" if emulated else "is real: give None")
                                   + " (dpteach.training.prologue's Setup.fields gives it)")
        return self

    def _check_emulated_peers(self, world) -> None:
        """One real rank standing for ``world.emulated_size``: only what the link can time honestly."""
        cls = strategy_class(self.strategy)
        if not cls.emulates_peers:
            raise ValueError(f"strategy={self.strategy!r} is not allowed with peers='emulated': its ranks do what one "
                             f"rank cannot stand for (a parameter server and its workers; FSDP2's real shards); "
                             f"use real ranks")
        if cls.communicates and self.link is None:
            raise ValueError("link=None is not allowed with peers='emulated': the emulated link is what times the "
                             "peers' exchange; choose a link (e.g. 'ib' or 'nvlink')")
        if self.all_reduce != "builtin":
            raise ValueError(f"all_reduce={self.all_reduce!r} is not allowed with peers='emulated': the course's own "
                             f"collectives run between real ranks; leave all_reduce='builtin'")

    def knob_values(self) -> dict:
        """Every knob of this run's strategy (``Strategy.knobs``) with its value: given, or its default."""
        return strategy_class(self.strategy).settings(self.knobs)

    def global_batch(self, world_size: int) -> int:
        return self.batch_per_rank * world_size * self.accum_steps

    def dataset_size(self, world_size: int) -> int:
        return self.num_samples or self.steps * self.global_batch(world_size)


class SyncTrainer:
    """One synchronous strategy on this rank: its model, optimizer and data, advanced step by step."""

    def __init__(self, config: TrainConfig):
        self.config, self.rank, self.world = config, dist.get_rank(), dist.get_world_size()
        self.memory = AllocatorPeak(context.device())
        self.model, self.dataset, self.criterion = build_replica(config)
        self.timeline = Timeline(context.device())
        self.strategy = make_strategy(config.strategy, self.model, self.timeline, config.bucket_mb,
                                      config.first_bucket_mb, link=config.link, all_reduce=config.all_reduce,
                                      grad_comm=config.grad_comm, knobs=config.knobs,
                                      timed_world_size=config.timed_world_size)
        self.precision = Precision(config.precision, config.clip_norm, config.init_scale, config.growth_interval,
                                   config.unscale_before_clip)
        self.module = self.strategy.wrap()
        self.optimizer = self.strategy.make_optimizer(lambda params: make_optimizer(config, params))
        self.batches = step_batches(config, self.dataset, self.world)
        if config.input_noise:
            torch.manual_seed(config.seed + self.rank)  # each rank its own stream, as augmentation would draw
        self.losses, self.step_times, self.wire_bytes = [], [], []
        self.memory.built()

    def step(self, step: int) -> None:
        config, strategy, timeline, device = self.config, self.strategy, self.timeline, context.device()
        micro_batches = split_for_rank(next(self.batches), self.rank, self.world, config.batch_per_rank,
                                       config.accum_steps)
        strategy.start_step(step)
        self.memory.step_starts()
        start = time.perf_counter()
        if self.rank == config.slow_rank:  # a straggler: slower compute, or a busier machine
            time.sleep(config.slow_ms / 1e3)
        step_loss = torch.zeros((), dtype=torch.float64, device=device)  # read once per step: no sync per micro-batch
        for k, indices in enumerate(micro_batches):
            x, y = (t.to(device) for t in sample_batch(self.dataset, indices))
            if config.input_noise:
                x = x + config.input_noise * torch.randn(x.shape).to(device)
            with strategy.micro_batch(sync=(k == len(micro_batches) - 1)):  # decided before forward
                with timeline.span(step, "forward"), self.precision.autocast():
                    loss = self.criterion(self.module(x), y) / config.accum_steps
                with timeline.span(step, "backward"):
                    self.precision.backward(loss)  # fp16: the loss times the scale
            step_loss += loss.detach()
        strategy.finish(step)
        with timeline.span(step, "optimizer"):
            self.precision.step(strategy, self.optimizer)  # unscale and clip if asked, then step (or skip)
        context.synchronize()
        self.step_times.append(time.perf_counter() - start)
        self.memory.step_ends()
        timeline.resolve()
        self.losses.append(step_loss.item())
        self.wire_bytes.append(strategy.wire_bytes)

    def summary(self) -> dict:
        self.strategy.unshard()
        summary = summarise(self.config, self.model, self.losses, self.step_times, self.wire_bytes, self.timeline,
                            hook_calls=getattr(self.strategy, "hook_calls", None))
        summary["link"] = self.strategy.comm.report()  # None without an emulated link
        summary["notes"] = self.strategy.notes
        summary["state_bytes"] = self.strategy.state_bytes
        summary["peak_bytes"] = self.strategy.state_bytes + self.strategy.peak_extra_bytes
        summary["precision"] = self.precision.report()  # None in plain fp32 without clipping
        summary["allocator_peak_bytes"] = self.memory.peak  # None off CUDA
        self.strategy.close()  # its hooks off the model: the run is over
        return summary


class AllocatorPeak:
    """On a GPU, the most memory this run had allocated at once, read from CUDA's caching allocator
    (``torch.cuda.memory_allocated`` and ``max_memory_allocated``): its own tensors - model, gradients,
    buckets, optimizer state, and what forward, backward and the collectives allocate on the way (FSDP2's
    buffers included, which no counting of the strategy's tensors sees). Runs trained side by side share
    the GPU, so each counts only what was allocated while it built and stepped: what it keeps, plus the
    most it allocated during one of its steps. None off CUDA."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.device, self.peak, self.kept = device, None, 0
        self._before = torch.cuda.memory_allocated(device) if self.cuda else 0

    def built(self) -> None:
        if self.cuda:
            self.kept = torch.cuda.memory_allocated(self.device) - self._before
            self.peak = self.kept

    def step_starts(self) -> None:
        if self.cuda:
            self._before = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)

    def step_ends(self) -> None:
        if self.cuda:
            self.peak = max(self.peak, self.kept + torch.cuda.max_memory_allocated(self.device) - self._before)
            self.kept += torch.cuda.memory_allocated(self.device) - self._before  # what the step kept (Adam's state)


def train_on_rank(config: TrainConfig) -> dict:
    """Run one strategy for ``config.steps`` steps on this rank; return plain data."""
    strategy = strategy_class(config.strategy)
    if not strategy.lockstep:  # its own loop, with no step shared between ranks (the parameter server)
        return strategy.train_on_rank(config)
    trainer = SyncTrainer(config)
    start_together(trainer.timeline)
    started = time.perf_counter()
    for step in range(config.steps):
        trainer.step(step)
    return {**trainer.summary(), "started_at": started}


def train_interleaved_on_rank(configs: list[TrainConfig], on_step=None) -> list[dict]:
    """Several synchronous strategies side by side: step s of each in turn, then step s+1.

    On a shared machine the background load drifts; run one strategy after another and a burst of
    load can land on just one of them. Interleaved, every strategy sees the same conditions, so
    their *ratios* stay meaningful. (Their timelines then have gaps where the others ran.) The order
    turns every step - A B C, then B C A, then C A B - so that no strategy always goes first, right after
    the pause in which the others ran (``dpteach/measure.py``, rule 1); every rank turns it alike, so
    their collectives still meet. ``on_step(step)``: called after each round (rank 0 reports progress).
    """
    trainers = [SyncTrainer(config) for config in configs]
    start_together(*(trainer.timeline for trainer in trainers))
    for step in range(max(config.steps for config in configs)):
        for trainer in turned(trainers, step):
            if step < trainer.config.steps:
                trainer.step(step)
        if on_step is not None:
            on_step(step)
    return [trainer.summary() for trainer in trainers]


def train_each_on_rank(configs: list[TrainConfig], interleave: bool = False) -> list[dict]:
    """Train each config in this world, one after another (or, with ``interleave``, the lockstep
    ones step by step side by side); results in the order of ``configs``. Rank 0 drives the bar."""
    results = {}
    together = [i for i, c in enumerate(configs) if interleave and strategy_class(c.strategy).lockstep]
    rounds = max((configs[i].steps for i in together), default=0)  # one tick per round of the side-by-side runs
    lead = context.rank() == 0
    if lead:
        desc = f"{len(together)} runs side by side, step" if together else "runs"
        context.report_progress(0, total=rounds + len(configs) - len(together), desc=desc)
    if together:
        tick = (lambda step: context.report_progress(1)) if lead else None
        for i, result in zip(together, train_interleaved_on_rank([configs[i] for i in together], on_step=tick)):
            results[i] = result
    for i, config in enumerate(configs):
        if i not in results:
            results[i] = train_on_rank(config)
            if context.rank() == 0:
                context.report_progress(1)
    return [results[i] for i in range(len(configs))]
