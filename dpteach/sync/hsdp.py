"""``hsdp``: hybrid sharding - ZeRO-3 inside each node, plain replication across nodes.

Fully sharding across every rank (``zero3``, ``fsdp``) sends every layer's all-gathers and its reduce-scatter
across the whole world, slow links included. Hybrid sharding lays the W ranks out as a 2-D mesh of R
replicas x S ranks per node (Zhao et al., "PyTorch FSDP: Experiences on Scaling Fully Sharded Data
Parallel", VLDB 2023, section 3.2, "hybrid sharding")::

    mesh = [[0, 1],        row    ("shard"):     one node; parameters, gradients and state sharded S ways
            [2, 3]]        column ("replicate"):  the ranks holding the same shard, one per node

    backward, each layer:  reduce-scatter its gradient inside the node     (fast link, S ranks)
    after backward:        all-reduce each gradient shard across nodes      (slow link, R ranks)
    forward / backward:    all-gather each layer's parameters inside the node (fast link)

Only the all-reduce of a 1/S shard crosses nodes: 2(R-1)/R x (Psi / S) bytes per rank and step, against
2(W-1)/W x Psi for a flat ring (``ddp``) - and a rank keeps 1/S of everything, not 1/W. Averaging stays
exact: the reduce-scatter takes the mean over the node's S ranks, the all-reduce the mean of the R node
means, which is the mean over all W ranks.

torch does the same with ``fully_shard(module, mesh=init_device_mesh(device, (R, S),
mesh_dim_names=("replicate", "shard")))``: a 2-D mesh, per its docstring (``torch/distributed/fsdp/
_fully_shard/_fully_shard.py``), shards across dim 1 and replicates across dim 0, placements
``(Replicate(), Shard(0))``; ``foreach_reduce`` in ``_fsdp_collectives.py`` reduce-scatters a layer's
gradients on the shard group and then ``dist.all_reduce``s the reduce-scatter output on the replicate group
(``all_reduce_group``, "not None iff HSDP"), per layer in backward, on a stream of its own on a GPU. The
course's ``hsdp`` waits for its reduce-scatters after backward and then sends the all-reduces: simpler, and
the same bytes. ``hsdp_torch`` is ``fsdp`` (``fsdp.py``) on that 2-D mesh, the reference ``hsdp`` is held to
as ``fsdp`` is for ``zero3``.

S is the ``hsdp_shard_size`` knob, else a ``TwoLevelLink``'s ``ranks_per_node`` (``network/two_level.py``),
else 2. Both strategies create the mesh's two process groups themselves, one dimension at a time, so that the
sockets gloo opens for each are known (gloo connects every pair of a group while ``new_group`` runs: the
sockets appear then, before any collective): each
step then reports the bytes the kernel counted as received on each group's sockets
(``network/traffic.py``, TCP_INFO), next to the bytes the course's ``Comm`` accounts for, in ``notes``.
"""
from __future__ import annotations

import statistics
from contextlib import contextmanager

import torch
import torch.distributed as dist

from ..network.traffic import Traffic
from ..network.comm import Comm
from ..network.costmodel import busbw_factor
from ..network.link import TwoLevelLink
from ..ranks import context
from .fsdp import TorchFSDP
from .knobs import Knob
from .zero3 import Zero3


def node_size(link, shard_size: int | None, world_size: int, strategy: str = "hsdp") -> int:
    """S, the ranks per node: ``shard_size`` (the knob), else a TwoLevelLink's ``ranks_per_node``, else 2 (a
    world of odd size: one node). A given S that does not divide the world, or that the link contradicts, is
    refused."""
    from_link = link.ranks_per_node if isinstance(link, TwoLevelLink) else None
    if shard_size is not None and from_link is not None and shard_size != from_link:
        raise ValueError(f"hsdp_shard_size={shard_size} is not allowed with link={link.name!r} of {from_link} ranks "
                         f"per node: {strategy} shards inside a node; leave hsdp_shard_size=None or give {from_link}")
    size = shard_size if shard_size is not None else from_link
    if size is None:
        return 2 if world_size % 2 == 0 else world_size
    if world_size % size:
        raise ValueError(f"world_size={world_size} is not allowed with {strategy} on nodes of {size} ranks: the "
                         f"2-D mesh needs whole nodes; use a multiple of {size} ranks")
    return size


def mean_over_steps(log: list[dict]) -> dict:
    """Each key's mean over the steps of ``log`` (None where a step has no value: nothing could be counted)."""
    return {key: None if any(step[key] is None for step in log) else statistics.mean(step[key] for step in log)
            for key in log[0]}


class HybridMesh:
    """The (replicate x shard) mesh over every rank - rank r in node r // S - with its two process groups
    made here, one dimension at a time, and the gloo sockets each opened (``Traffic``)."""

    def __init__(self, shard_size: int):
        from torch.distributed.device_mesh import DeviceMesh
        world, rank = dist.get_world_size(), dist.get_rank()
        layout = torch.arange(world).reshape(world // shard_size, shard_size)
        self.shape = tuple(layout.shape)  # (R, S)
        self.groups, self.traffic = {}, {}
        for dim, rows in (("shard", layout), ("replicate", layout.T)):
            traffic = Traffic()
            traffic.before_world()
            for ranks in rows.tolist():  # every rank makes every group of the dimension, in the same order
                group = dist.new_group(ranks)
                if rank in ranks:
                    self.groups[dim] = group
            traffic.world_started()
            self.traffic[dim] = traffic
        self.mesh = DeviceMesh.from_group([self.groups["replicate"], self.groups["shard"]], context.device().type,
                                          mesh=layout, mesh_dim_names=("replicate", "shard"))
        # sockets are counted on gloo only, where TCP_INFO works, and where the group had any (more than one rank)
        gloo = dist.get_backend() == "gloo"
        self.counts = {dim: gloo and t.counts and (bool(t._sockets) or self.groups[dim].size() == 1)
                       for dim, t in self.traffic.items()}

    def received(self) -> dict:
        """Bytes received so far on each group's sockets (None where they cannot be counted)."""
        return {dim: self.traffic[dim].received() if self.counts[dim] else None for dim in self.traffic}


class _Hybrid:
    """What both hybrid strategies share: the mesh, a second ``Comm`` for the replicate dimension (the first,
    ``self.comm``, is the shard group's), and the bytes of each level, counted and measured, per step."""

    shards = ("optimizer state", "gradients", "parameters")  # 1/S of each, not 1/W
    knobs = (Knob("hsdp_shard_size", None, "ranks per node, the size of each shard group (default: a two-level "
                                          "link's ranks per node, else 2)", low=1, none_ok=True),)
    emulates_peers = False  # its groups are real ranks
    takes_all_reduce = ()  # a Comm on a group runs torch's collectives only

    @classmethod
    def check(cls, config, world_size: int) -> None:
        super().check(config, world_size)
        node_size(config.link, cls.settings(config.knobs)["hsdp_shard_size"], world_size, cls.name)

    @classmethod
    def held_bytes_per_rank(cls, param_bytes, state_per_param, world_size, shard_size=None) -> float:
        """As zero3 holds them, with everything split S ways, not W (``shard_size``: S; None: the default)."""
        return super().held_bytes_per_rank(param_bytes, state_per_param, shard_size or node_size(None, None, world_size))

    def _make_mesh(self, link, shard_size, group) -> None:
        if group is not None:
            raise ValueError(f"group={group!r} is not allowed with strategy={self.name!r}: it lays out its own 2-D "
                             f"mesh over every rank; leave group=None")
        self.hybrid = HybridMesh(node_size(link, shard_size, dist.get_world_size(), self.name))
        self.level_log = []  # per step: bytes sent (counted) and received (measured) at each level

    @property
    def wire_bytes(self) -> int:
        return self.comm.sent + self.across.sent

    def start_step(self, step: int) -> None:
        super().start_step(step)
        self.across.new_step(step)
        self._received_before = self.hybrid.received()

    def step_optimizer(self, optimizer) -> None:
        super().step_optimizer(optimizer)  # the step's last collective is done: read the sockets
        self._note_levels()

    def _note_levels(self) -> None:
        replicas, shard = self.hybrid.shape
        received = {dim: None if now is None else now - self._received_before[dim]
                    for dim, now in self.hybrid.received().items()}
        inside, between = self.comm.sent, self.across.sent  # by construction: a shard group is one node
        if self.comm.levels is not None:  # a TwoLevelLink: its count, which agrees
            inside = self.comm.sent_inside + self.across.sent_inside
            between = self.comm.sent_between + self.across.sent_between
        self.level_log.append({
            "sent_inside": inside, "sent_between": between,
            "received_inside": received["shard"], "received_between": received["replicate"],
            # a ring all-reduce among R ranks: each receives 2(R-1)/R of the gradient shard
            "expected_between": int(busbw_factor(replicas) * self.gradient_shard_bytes()),
            # gloo's reduce-scatter moves what an all-reduce moves, 2(S-1)/S of its input where a ring needs
            # (S-1)/S (measured on its sockets): inside, gloo receives (S-1) shards more than the ring's account
            "expected_inside_gloo": inside + (shard - 1) * self.gradient_shard_bytes()})
        self.notes = {**(self.notes or {}), "replicas": replicas, "shard_size": shard,
                      "bytes_per_step": mean_over_steps(self.level_log), "steps": len(self.level_log),
                      "across_link": self.across.report()}


class HybridZero3(_Hybrid, Zero3):
    """The course's zero3 on the node (``mesh["shard"]``), one all-reduce per gradient shard across nodes."""

    name = "hsdp"
    label = "hsdp: zero3 in a node, all-reduce across"
    colour = "#DA8BC3"

    def __init__(self, model, timeline, hsdp_shard_size, link=None, group=None, **options):
        self._make_mesh(link, hsdp_shard_size, group)
        super().__init__(model, timeline, link=link, group=self.hybrid.mesh["shard"], **options)
        self.across = Comm(link, None, "builtin", timeline, group=self.hybrid.mesh["replicate"])

    def finish(self, step: int) -> None:
        super().finish(step)  # every layer's gradient reduce-scattered in the node: the mean over its S ranks
        works = []
        for group in self.groups:  # the mean of the R node means: divide, then sum across nodes
            if self.across.size > 1:
                group.grad_shard.div_(self.across.size)
            work = self.across.all_reduce(group.grad_shard, async_op=True)
            self.across.launched(work, "all_reduce")
            works.append(work)
        with self.across.waiting():
            for work in works:
                self.across.wait(work)

    def gradient_shard_bytes(self) -> int:
        return sum(g.grad_shard.numel() * g.grad_shard.element_size() for g in self.groups)


class TorchHSDP(_Hybrid, TorchFSDP):
    """torch's FSDP2 on the same 2-D mesh: ``fully_shard(layer, mesh=mesh)`` with mesh (replicate, shard)."""

    name = "hsdp_torch"
    label = "hsdp_torch (torch's FSDP2, 2-D mesh)"
    colour = "#8C8C8C"

    def __init__(self, model, timeline, hsdp_shard_size, link=None, group=None, **options):
        self._make_mesh(link, hsdp_shard_size, group)
        super().__init__(model, timeline, link=link, group=self.hybrid.mesh["shard"], **options)
        self.across = Comm(None, None, "builtin", timeline, group=self.hybrid.mesh["replicate"])

    def fsdp_mesh(self):
        return self.hybrid.mesh

    @contextmanager
    def micro_batch(self, sync: bool):
        with super().micro_batch(sync):  # counts the all-gathers and reduce-scatters on the node
            yield
        if sync:  # ... and FSDP2 all-reduced each layer's reduce-scattered shard across nodes
            for layer in self.layers:
                self.across.count("all_reduce", self.unsharded[layer] // self.world)

    def gradient_shard_bytes(self) -> int:
        return sum(self.unsharded[layer] // self.world for layer in self.layers)
