"""What every gradient-sync strategy answers: when, and how, do the ranks' gradients become their average?

The trainer drives every strategy through the same three calls, in this order, every step::

    for k in range(K):                                  # K micro-batches (gradient accumulation)
        with strategy.micro_batch(sync=(k == K - 1)):   # decided BEFORE forward
            loss = loss_fn(model(x_k), y_k) / K
            loss.backward()
    strategy.finish(step)                               # afterwards: every .grad is the average
    optimizer.step()

Why is ``sync`` decided before forward? PyTorch DDP arms its reducer during forward (that is
where it learns which parameters will get gradients), and ``no_sync()`` has to wrap forward *and*
backward of the micro-batches that must not communicate. Deciding after forward is too late:
the hooks are already armed. Strategies that communicate from autograd hooks (``overlap``) read
the same flag when the hooks fire.

Gradients are averaged, not summed: each rank's loss is a mean over its own batch, so the mean of
the W ranks' gradients is the gradient of the mean over the global batch - the single-process
gradient. (The strategies divide by W and then sum, as DDP's default ``allreduce_hook`` does in
``torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py``: dividing first keeps a sum of W
large gradients from overflowing a 16-bit format. gloo and NCCL also offer ``ReduceOp.AVG``.)

Every strategy sends through ``self.comm`` (a ``Comm``, ``dpteach/network/comm.py``): straight to
``torch.distributed``, or, when the run chose a ``link``, through an emulated network
(``dpteach/network/emulated.py``) that holds each collective back until that link would have delivered it.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from ..network.comm import Comm
from ..replica.model_states import held_per_rank
from .knobs import settings


def held_bytes(tensors) -> int:
    """Bytes of memory behind ``tensors``, each storage counted once (views of one flat buffer share it)."""
    storages = {}
    for t in tensors:
        if t is None:
            continue
        t = t.to_local() if hasattr(t, "to_local") else t  # a DTensor: this rank's piece
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


class ReadyCount:
    """Which groups of parameters (buckets, layers) have all their gradients: what a strategy that
    communicates from backward hooks must know before it launches a group's collective. Each group
    waits for ``len(group.params)`` gradients; ``arrived(group)`` counts one and says whether that was
    the last; ``reset()`` starts a new backward (every micro-batch runs every layer again)."""

    def __init__(self, groups):
        self.groups = list(groups)
        self.reset()

    def reset(self) -> None:
        self.waiting = {id(group): len(group.params) for group in self.groups}  # buckets compare by value

    def arrived(self, group) -> bool:
        self.waiting[id(group)] -= 1
        return self.waiting[id(group)] == 0

    def complete(self, group) -> bool:
        return self.waiting[id(group)] == 0


class Strategy:
    """What every strategy says about itself, so that no caller needs to know strategies by name.

    ``exact``: ends at single-process training's weights up to float32 rounding (``dpteach/training/reference.py``).
    ``lockstep``: every rank takes step s together, driven by ``train.SyncTrainer``; several such
    strategies can then run step by step side by side (``train.train_interleaved_on_rank``). A
    strategy that is not in lockstep runs its own loop: ``cls.train_on_rank(config)``.
    ``servers``: ranks that only serve and compute no gradient; the other ``workers(W)`` ranks share
    each global batch. ``emulates_link``: its messages can go through an emulated network
    (``dpteach/network/emulated.py``). ``communicates``: False only for the no-communication floor, ``local``.
    ``takes_all_reduce``: the course's collectives it can run on instead of torch's (``all_reduce=``).
    ``shards``: what each rank keeps only 1/W of (ZeRO's stages: "optimizer state", then "gradients",
    then "parameters"); a strategy that shards the parameters gathers them again every micro-batch.
    ``label``, ``colour``: how lessons name and draw it; ``codec``: what its gradients travel as.
    ``knobs``: its own options, declared as ``knobs.Knob`` (``settings`` checks a run's values); ``main_knob``:
    the one a variant name sets. The names of its overhead spans are the names it gives ``overhead``.
    """

    name = "base"
    notes = None  # what a strategy counts of its own last step, reported with its run (zero3's gathers)
    exact = True
    lockstep = True
    servers = 0
    emulates_link = True
    communicates = True
    takes_all_reduce = ()  # the course's collectives it can run on instead of torch's: "ring", "tree"
    shards = ()
    takes_grad_comm = False  # can send its gradients in a 16-bit dtype (``grad_comm=``): ddp, with a comm hook
    measures_exposure = True  # marks where it waits for communication (``timeline.exposed_time``); FSDP2 waits
    #                           inside torch, where no span reaches
    emulates_peers = True  # can run as one real rank whose W-1 peers the link emulates (``peers="emulated"``)
    label = None  # in legends and tables; None: its name
    colour = "#4C72B0"
    codec = "fp32"  # what one gradient element travels as: "fp32", "fp16", "bf16" or "int8"
    knobs = ()  # its own options, each a ``knobs.Knob`` (``powersgd_rank``, ``sync_every``...): sync/knobs.py
    main_knob = None  # the name of the one a variant name sets: "powersgd@16" is powersgd with powersgd_rank=16

    @classmethod
    def title(cls) -> str:
        return cls.label or cls.name

    @classmethod
    def settings(cls, given: dict | None = None) -> dict:
        """Every knob of this strategy with its value for a run: ``given`` (a run's ``TrainConfig.knobs``)
        checked, the rest at their defaults; a bad name or value is refused with what is allowed."""
        return settings(cls.name, cls.knobs, given)

    @classmethod
    def held_bytes_per_rank(cls, param_bytes: float, state_per_param: float, world_size: int) -> float:
        """What a rank holds at its optimizer step under the ZeRO paper's accounting (section 3.1): parameters
        P, gradients P and optimizer state ``state_per_param`` x P bytes, each part that the strategy
        ``shards`` divided by W (stage 1: the state; stage 2: the gradients too; stage 3: the parameters too)."""
        parts = {"params": param_bytes, "grads": param_bytes, "optimizer": state_per_param * param_bytes}
        return held_per_rank(parts, world_size, cls.shards)["total"]

    @classmethod
    def steady_from(cls, config: dict) -> int:
        """The first step from which every step sends what the run's later steps send (``config``: a run's
        ``TrainConfig`` as a dict, its knobs under ``"knobs"``). 0 for every strategy but one that starts in
        another mode: PowerSGD's first
        ``powersgd_start`` steps are plain all-reduces. Its bytes per step are counted from here, as step times
        leave out the warm-up."""
        return 0

    @classmethod
    def cycle(cls, config: dict) -> int:
        """How many steps make one whole pattern of its messages (1: every step sends the same; local SGD: H).
        A step time is only a fair sample over whole cycles (``compare``'s time-to-target interval)."""
        return 1

    @classmethod
    def workers(cls, world_size: int) -> int:
        """How many of ``world_size`` ranks compute gradients (and share the global batch)."""
        return world_size - cls.servers

    @classmethod
    def check(cls, config, world_size: int) -> None:
        """Refuse knobs, a world, link or all-reduce this strategy cannot run with (``TrainConfig.check`` calls it)."""
        cls.settings(config.knobs)
        if cls.workers(world_size) < 1:
            raise ValueError(f"strategy={config.strategy!r} with world_size={world_size} is not allowed: "
                             f"{cls.servers} rank(s) only serve, so at least one more rank must be a worker")
        if config.link is not None and not cls.emulates_link:
            raise ValueError(f"link is not allowed with strategy={config.strategy!r}: its messages are not emulated; "
                             f"leave link=None")
        if config.all_reduce != "builtin" and config.all_reduce not in cls.takes_all_reduce:
            raise ValueError(f"all_reduce={config.all_reduce!r} is not allowed with strategy={config.strategy!r}: the "
                             f"course's own collectives block until done, so only strategies that can wait for them "
                             f"take them (naive and bucketed: ring or tree; zero1-3: ring, for their reduce-scatter "
                             f"and all-gather); leave all_reduce='builtin'")
        if config.grad_comm != "fp32" and not cls.takes_grad_comm:
            raise ValueError(f"grad_comm={config.grad_comm!r} is not allowed with strategy={config.strategy!r}: only "
                             f"'ddp' sends its gradients through a communication hook that casts them (the 'fp16' and "
                             f"'bf16' strategies cast them by hand); leave grad_comm='fp32'")
        if config.precision != "fp32" and not cls.lockstep:
            raise ValueError(f"precision={config.precision!r} is not allowed with strategy={config.strategy!r}: it runs "
                             f"its own loop outside the trainer; use a lockstep strategy or precision='fp32'")
        if cls.shards and (config.precision == "fp16" or config.clip_norm is not None):
            raise ValueError(f"precision='fp16' and clip_norm are not allowed with strategy={config.strategy!r}: each "
                             f"rank holds a different shard of the gradients, so the overflow flag and the gradient "
                             f"norm would need an all-reduce first (FSDP's ShardedGradScaler does it); this course "
                             f"applies them to the replicated strategies only (bf16 works with every strategy)")


class GradientSync(Strategy):
    """Base class: holds the model, the timeline, and the byte count; subclasses fill in ``finish``."""

    def __init__(self, model: torch.nn.Module, timeline, link=None, all_reduce: str = "builtin", group=None,
                 timed_world_size: int | None = None, **options):
        self.model = model
        self.timeline = timeline
        self.options = options
        # ``group``: the ranks this strategy synchronises among (a ProcessGroup or 1-D DeviceMesh; None: all).
        # ``timed_world_size``: with emulated peers, the world the one real rank's link and byte counts are timed for.
        self.comm = Comm(link, timed_world_size if group is None else None, all_reduce, timeline, group=group)
        self.world, self.rank = self.comm.size, self.comm.rank
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.handles = []  # the hooks it registered (on parameters, layers), removed by close()
        self.will_sync = True
        self.state_bytes = 0  # held at the optimizer step, the most seen (note_state)
        self.transient_bytes = self.peak_extra_bytes = 0  # buffers alive now, and the most at once (hold)

    def wrap(self) -> torch.nn.Module:
        """The module the trainer calls for forward (DDP returns its wrapper)."""
        return self.model

    @contextmanager
    def micro_batch(self, sync: bool):
        """Run one micro-batch's forward and backward; ``sync`` says whether it is the last one."""
        self.will_sync = sync
        yield

    @property
    def wire_bytes(self) -> int:
        """Bytes this rank sent in the current step, as its ``Comm`` counted them."""
        return self.comm.sent

    def start_step(self, step: int) -> None:
        self.step = step
        self.comm.new_step(step)

    def overhead(self, step: int, name: str):
        """Around work that is neither compute nor communication - packing a bucket, unpacking it, encoding,
        decoding: the step's overhead, by the name given here (``timeline.step_accounting`` adds the spans so
        marked up per name; ``dpteach/training/accounting.py`` reports them)."""
        return self.timeline.span(step, name, overhead=True)

    def finish(self, step: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Remove every hook the strategy registered: the model is left as it was given, for whatever trains
        it next (the trainer closes each strategy when its run is over)."""
        for handle in self.handles:
            handle.remove()
        self.handles = []

    # -- the optimizer: every parameter, or (sharded strategies) this rank's shard ------------
    def make_optimizer(self, build):
        """The optimizer, from ``build(params)``; a sharded strategy hands it only its own shard."""
        return build(self.model.parameters())

    def step_optimizer(self, optimizer) -> None:
        """Step, note what this rank holds at that moment (``state_bytes``), and clear the gradients."""
        optimizer.step()
        self.note_state(optimizer)
        optimizer.zero_grad()

    def held_tensors(self) -> list:
        """The tensors behind this rank's parameters and gradients (flat buffers count once)."""
        return [t for p in self.model.parameters() for t in (p, p.grad)]

    def note_state(self, optimizer) -> None:
        """Parameters, gradients and optimizer state this rank holds, measured from its tensors."""
        state = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
        self.state_bytes = max(self.state_bytes, held_bytes(self.held_tensors() + state))

    def unshard(self) -> None:
        """Make the model's own parameters whole again (a sharded strategy, before the run reports them)."""

    def hold(self, nbytes: int) -> None:
        """A transient buffer of ``nbytes`` is alive (unsharded parameters, a bucket before its
        reduce-scatter): ``peak_extra_bytes`` keeps the most alive at once."""
        self.transient_bytes += nbytes
        self.peak_extra_bytes = max(self.peak_extra_bytes, self.transient_bytes)

    def release(self, nbytes: int) -> None:
        self.transient_bytes -= nbytes

    # -- helpers the strategies share --------------------------------------------------------
    def all_reduce_mean(self, tensor: torch.Tensor, async_op: bool = False):
        """Divide by W, then sum across ranks: the mean, with no AVG op needed (DDP does the same)."""
        if self.world > 1:  # dividing by one changes nothing, and costs a pass over the tensor
            tensor.div_(self.world)
        return self.comm.all_reduce(tensor, async_op=async_op)
