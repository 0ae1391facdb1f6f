"""``Comm``: the collectives a strategy sends through - torch's, the course's own, or on an emulated link.

Every strategy calls ``self.comm.all_reduce(...)`` (or ``all_gather``, ``reduce_scatter``, ...) with the
arguments of its ``torch.distributed`` namesake plus ``async_op``, and gets a work handle (``wait()``,
``get_future()``, ``is_completed()``) when asynchronous, ``None`` when blocking. These are decided here,
once, rather than in every strategy:

* **Which all-reduce runs**: torch's (``"builtin"``, whatever algorithm the backend picks) or one the
  course builds from send and receive (``"ring"``, ``"tree"``: ``dpteach/collectives``), so that a learner
  can train with the ring they just read. Those block until done and count the bytes this rank sent
  from their own trace.
* **Whether anything is sent at all.** In a world of one rank a collective is the identity: the sum of
  one tensor is itself, the gather of one shard is that shard. No message leaves the process, so none
  is started - torch would still queue one and wait for it, and a W=1 run would report that wait as
  communication when there was none.
* **What it cost on the wire.** Each call counts the bytes this rank puts on the wire (``sent``, since
  ``new_step``): for torch's collectives the ring's account (nccl-tests' busbw factor 2(W-1)/W for an
  all-reduce, (W-1)/W of the whole for an all-gather, a reduce-scatter or an all-to-all), for the
  course's own what their trace shows this rank sent. Strategies count nothing themselves.
* **Where it shows on the timeline.** A blocking exchange is one span on the communication lane, the
  compute standing still (``exchange``); a collective launched without waiting is drawn from launch to
  completion (``launched``, ``poll``, ``wait``), and the time the compute then waits for it is a span of
  its own (``waiting``). Strategies open no communication span themselves.
* **The link.** With an emulated network (``emulated.py``) each collective completes no earlier than that
  link would deliver it - on the host's clock on CPU ranks (``emulated.EmulatedLink``), on the GPU's clock
  on GPU ranks (``emulated_gpu.StreamLink``). The link carries a world of ``world_size`` ranks, which may be
  larger than the real one: with *emulated peers* one real rank trains and the link times each exchange
  as W ranks would (``dpteach.ranks.world``, ``peers="emulated"``); byte counts follow the same W.
* **Among whom.** A ``Comm`` speaks to one process group: the whole world by default, or the ``group``
  it is given (a ``ProcessGroup``, or a one-dimensional ``DeviceMesh``, or one dimension of a larger
  mesh: ``mesh["replicate"]``). A strategy built on a group synchronises among that group's ranks only,
  so a hybrid scheme (shard within a node, replicate across nodes: HSDP, Zhao et al. 2023, PyTorch FSDP)
  is two ``Comm``s, one per dimension, and no change to the strategies. On a network of two levels
  (``link.TwoLevelLink``) a group's collectives run on the fast link when all its ranks share a node,
  else on the slow one (a ring that spans nodes moves at the pace of its slowest hop); of ``sent``,
  ``sent_between`` is the share that the group's ring hops across nodes carry, ``sent_inside`` the rest.
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist

from ..collectives import ALL_REDUCE, ring_all_gather, ring_reduce_scatter
from ..ranks import context
from .costmodel import busbw_factor
from .emulated import EmulatedLink
from .link import Link, TwoLevelLink
from .two_level import levels


def as_process_group(group):
    """``None`` (the whole world), a ``ProcessGroup``, or a one-dimensional ``DeviceMesh`` -> a process group
    (``None`` for the world, as ``torch.distributed`` takes it)."""
    from torch.distributed.device_mesh import DeviceMesh
    if isinstance(group, DeviceMesh):
        if group.ndim != 1:
            raise ValueError(f"group={group!r} is not allowed: a mesh of {group.ndim} dimensions names no single group; "
                             f"give one of its dimensions (mesh['name']) or a ProcessGroup")
        return group.get_group()
    if group is None or isinstance(group, dist.ProcessGroup):
        return group
    raise ValueError(f"group={group!r} is not allowed: give None (every rank), a ProcessGroup or a 1-D DeviceMesh")


class _Finished:
    """The work handle of a collective that has already run to the end (the course's own collectives,
    or any collective of a one-rank world). On a GPU its future is CUDA-aware: whoever waits on it waits
    for the GPU work queued before it, as with NCCL's own."""

    def __init__(self, value=None, device: torch.device | None = None):
        cuda = device is not None and device.type == "cuda"
        self.future = torch.futures.Future(devices=[device]) if cuda else torch.futures.Future()
        self.future.set_result(value)

    def wait(self) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        return self.future


class Comm:
    """This rank's collectives among ``group`` (default: every rank). ``world_size``: the ranks the link and
    the byte counts are for - the group's size, or with emulated peers the size of the world being emulated
    (``None``: the group's). ``rank`` and ``size`` are this rank's place in the real group."""

    def __init__(self, link: Link | None, world_size: int | None = None, all_reduce: str = "builtin", timeline=None,
                 group=None):
        self.group = as_process_group(group)
        self.rank, self.size = dist.get_rank(self.group), dist.get_world_size(self.group)
        self.world_size = self.size if world_size is None else world_size
        self.timeline, self.step = timeline, 0
        self.open = []  # (work, step, name, start) of collectives launched and not yet seen finished
        self.alone = self.size == 1  # one real rank: collectives are the identity
        self.device = context.device()
        if all_reduce != "builtin" and self.group is not None:
            raise ValueError(f"all_reduce={all_reduce!r} is not allowed with a group: the course's own collectives "
                             f"run among every rank; use all_reduce='builtin' for a strategy on a group")
        self.algorithm = all_reduce
        self.sent = 0  # bytes this rank put on the wire since new_step()
        self.total_sent = 0  # and since it was made
        self.last_bytes = 0  # what the last collective put on the wire
        self.levels = None  # on a TwoLevelLink: this group's level, and its ring's share of hops between nodes
        if isinstance(link, TwoLevelLink):
            ranks = range(self.world_size) if self.group is None else dist.get_process_group_ranks(self.group)
            self.levels = levels(link, ranks)
            link = self.levels.link
        if link is None:
            self.emulator = None
        elif self.device.type == "cuda":
            from .emulated_gpu import StreamLink
            self.emulator = StreamLink(link, self.world_size, self.device)
        else:
            self.emulator = EmulatedLink(link, self.world_size)

    @property
    def sent_between(self) -> int | None:
        """Of ``sent``, the bytes that crossed nodes (a ``TwoLevelLink`` only; else None)."""
        return None if self.levels is None else self.levels.between(self.sent)

    @property
    def sent_inside(self) -> int | None:
        return None if self.levels is None else self.sent - self.levels.between(self.sent)

    def new_step(self, step: int = 0) -> None:
        self.total_sent += self.sent
        self.step, self.sent = step, 0

    # -- the timeline: where each collective shows ------------------------------------------------
    @contextmanager
    def exchange(self, name: str = "comm", **ids):
        """Around a blocking exchange (one or more calls, and the arithmetic they need): one span on the
        communication lane, ``blocking`` - the compute stands still for all of it (``timeline.exposed_time``) -
        that says how many bytes this rank put on the wire inside it."""
        if self.timeline is None:
            yield
            return
        start, sent = self.timeline.event(), self.sent
        yield
        self.timeline.add(self.step, name, start, self.timeline.event(), lane="comm", blocking=True,
                          bytes=self.sent - sent, **ids)

    def waiting(self):
        """Around waiting for collectives launched earlier: the time the compute stood still for them."""
        return nullcontext() if self.timeline is None else self.timeline.span(self.step, "wait")

    def launched(self, work, name: str) -> None:
        """A collective launched without waiting, drawn from now to when it is seen finished.

        Not every work has a completion callback (gloo's reduce-scatter has no future), so completion is
        looked for with ``is_completed()`` whenever the strategy next runs - every hook (``poll``), every
        wait: a span ends at the first moment it was seen finished, a little after the fact, never before.
        (gloo's reduce-scatter reports itself completed only once waited for: its spans end at the wait.)"""
        if self.timeline is not None:
            self.open.append((work, self.step, name, self.timeline.event(), self.last_bytes))
            self.poll()

    def poll(self, done=None) -> None:
        """Close the spans of the collectives seen finished (``done``: one just waited for)."""
        still = []
        for work, step, name, start, nbytes in self.open:
            if work is done or work.is_completed():
                self.timeline.add(step, name, start, self.timeline.event(), lane="comm", bytes=nbytes)
            else:
                still.append((work, step, name, start, nbytes))
        self.open = still

    def wait(self, work) -> None:
        work.wait()
        self.poll(done=work)  # gloo's reduce-scatter may not report itself completed even after wait()

    def count(self, kind: str, nbytes: int) -> None:
        """Add what a ring puts on this rank's wire for a ``kind`` collective of ``nbytes`` in all - also for
        collectives torch runs without passing here (FSDP2's own)."""
        if kind == "all_reduce":
            self.last_bytes = int(nbytes * busbw_factor(self.world_size))
        else:  # an integer times (W-1), then divided: exact wherever W divides it, as the buffers here are cut
            self.last_bytes = int(nbytes * (self.world_size - 1) / self.world_size)
        self.sent += self.last_bytes

    def _run(self, kind: str, nbytes: int, start_real, async_op: bool, algorithm: str = "ring", counted=False):
        if not counted:  # the course's own collectives counted what they sent (``_course``)
            self.count(kind, nbytes)
        if self.emulator is None:
            work = start_real()
            if async_op:
                return work
            work.wait()
            return None
        return self.emulator.launch(kind, nbytes, start_real, async_op, algorithm)

    def _local(self, value, copy=None) -> _Finished:
        """A one-rank collective: nothing leaves the process (``copy()`` fills an output where there is one)."""
        if copy is not None:
            copy()
        return _Finished(value, self.device)

    def all_reduce(self, tensor: torch.Tensor, async_op: bool = False):
        nbytes = tensor.numel() * tensor.element_size()
        if self.alone:  # the link times the algorithm that would have run
            algorithm = "ring" if self.algorithm == "builtin" else self.algorithm
            return self._run("all_reduce", nbytes, lambda: self._local([tensor]), async_op, algorithm)
        if self.algorithm == "builtin":
            return self._run("all_reduce", nbytes, lambda: dist.all_reduce(tensor, group=self.group, async_op=True),
                             async_op)
        if async_op:
            raise ValueError(f"all_reduce={self.algorithm!r} cannot run with async_op=True: the course's own "
                             f"collectives return when they are done; use them after backward")
        all_reduce = ALL_REDUCE[self.algorithm]  # in place
        return self._run("all_reduce", nbytes, lambda: self._course(lambda trace: all_reduce(tensor, trace=trace,
                                                                                             check=False)),
                         False, self.algorithm, counted=True)

    def _course(self, run, output: torch.Tensor | None = None) -> _Finished:
        """Run one of the course's collectives now (``run(trace)``), copy its result into ``output`` when it
        is not in place, and count the bytes this rank sent from the trace."""
        trace = []
        result = run(trace)
        if output is not None:
            output.copy_(result.reshape(output.shape))
        me = self.rank
        self.last_bytes = sum(t["elements"] for t in trace if t["src"] == me) * result.element_size()
        self.sent += self.last_bytes
        return _Finished([result], self.device)

    def all_gather(self, outputs: list, tensor: torch.Tensor, async_op: bool = False):
        total = tensor.numel() * tensor.element_size() * self.world_size
        if self.alone:
            return self._run("all_gather", total, lambda: self._local(outputs, lambda: outputs[0].copy_(tensor)),
                             async_op)
        return self._run("all_gather", total, lambda: dist.all_gather(outputs, tensor, group=self.group, async_op=True),
                         async_op)

    def all_gather_into_tensor(self, output: torch.Tensor, tensor: torch.Tensor, async_op: bool = False):
        total = tensor.numel() * tensor.element_size() * self.world_size
        if self.alone:
            return self._run("all_gather", total, lambda: self._local([output], lambda: output.copy_(tensor)),
                             async_op)
        if self.algorithm == "ring":  # the course's own (blocking: "asynchronous" means already done)
            return self._run("all_gather", total,
                             lambda: self._course(lambda trace: ring_all_gather(tensor, trace=trace), output), async_op,
                             counted=True)
        # Newer torch releases call all_gather_into_tensor all_gather_single (and warn on the old name).
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return self._run("all_gather", total, lambda: gather(output, tensor, group=self.group, async_op=True), async_op)

    def reduce_scatter(self, output: torch.Tensor, tensor: torch.Tensor, async_op: bool = False):
        """Sum ``tensor`` (W equal chunks) over the ranks; chunk r of the sum lands in rank r's ``output``."""
        nbytes = tensor.numel() * tensor.element_size()
        if self.alone:
            return self._run("reduce_scatter", nbytes,
                             lambda: self._local([output], lambda: output.copy_(tensor.reshape(output.shape))),
                             async_op)
        if self.algorithm == "ring":
            return self._run("reduce_scatter", nbytes,
                             lambda: self._course(lambda trace: ring_reduce_scatter(tensor, trace=trace, check=False),
                                                  output), async_op, counted=True)
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor  # the newer name
        return self._run("reduce_scatter", nbytes, lambda: scatter(output, tensor, group=self.group, async_op=True),
                         async_op)

    def all_to_all_single(self, output: torch.Tensor, tensor: torch.Tensor, async_op: bool = False):
        nbytes = tensor.numel() * tensor.element_size()
        if self.alone:
            return self._run("all_to_all", nbytes, lambda: self._local([output], lambda: output.copy_(tensor)),
                             async_op)
        return self._run("all_to_all", nbytes,
                         lambda: dist.all_to_all_single(output, tensor, group=self.group, async_op=True), async_op)

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        """Blocking: ``tensor`` of the group's rank ``src`` on every rank of the group (settings, not gradients:
        not counted, not on the link)."""
        if not self.alone:
            dist.broadcast(tensor, src=self._global(src), group=self.group)

    # -- point to point: a parameter server's pushes and pulls -------------------------------------------
    def send(self, tensor: torch.Tensor, dst: int) -> None:
        """Blocking send to the group's rank ``dst``, counted (point-to-point messages are not emulated on a link)."""
        self.sent += tensor.numel() * tensor.element_size()
        dist.send(tensor, self._global(dst), group=self.group)

    def recv(self, tensor: torch.Tensor, src: int | None = None) -> int:
        """Blocking receive from the group's rank ``src``, or from whichever sends first (``None``: gloo allows
        it, NCCL does not); returns the sender."""
        sender = dist.recv(tensor, None if src is None else self._global(src), group=self.group)
        return sender if self.group is None else dist.get_group_rank(self.group, sender)

    def _global(self, rank: int) -> int:
        return rank if self.group is None else dist.get_global_rank(self.group, rank)

    def report(self) -> dict | None:
        """Messages, the link's time for them, and how many this machine was too slow to emulate."""
        if self.emulator is None:
            return None
        return {**self.emulator.report(), **({} if self.levels is None else {"levels": self.levels.as_dict()})}
