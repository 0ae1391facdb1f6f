"""``zeropp``: ZeRO++ - ZeRO-3 with three ways to send less across nodes, each switched on its own.

Wang et al., "ZeRO++: Extremely Efficient Collective Communication for Giant Model Training" (2023), its design
of the three parts, and DeepSpeed's ZeRO++ tutorial. ZeRO-3 (``zero3.py``) moves about 3M per step and rank for
a model of M bytes: an all-gather of the weights in forward, another in backward, a reduce-scatter of the
gradients - each across the whole world, slow links between nodes included. ZeRO++ attacks each of the three:

* **qwZ**, quantised weights: each rank block-quantises its shard to int8 before the all-gather and every rank
  rebuilds the layer from the int8 pieces and their scales (``blockwise.py``). The master shard, which the
  optimizer steps, stays float32: only the copy the layer computes with is rounded, by at most half a step.
  The course quantises every all-gather of the weights that crosses the world.
* **hpZ**, a secondary partition inside the node: after forward's all-gather a rank keeps 1/S of the layer it
  just used (S ranks per node) instead of dropping it. Backward's all-gather then runs among the node's S ranks
  only: nothing crosses nodes, for 1/S of the layer held per rank until backward, on top of its own 1/W shard
  (the ZeRO++ blog counts the secondary partition in addition to ZeRO-3's). It changes no number
  (the secondary copy is what forward computed with), so ``zeropp`` with hpZ alone equals ``zero3``.
* **qgZ**, quantised gradients in two hops: instead of one reduce-scatter across the world, a rank quantises its
  gradient (int4 by default), trades pieces with its node by all-to-all and sums them, quantises the node's
  partial sums again and trades them across nodes with the ranks of the same local index, and sums once more.
  Each rank ends with its shard of the mean. A ring of quantised reduce-scatters would round at every one of
  its W - 1 hops; the all-to-all rounds twice, and only 1/S of the gradient crosses nodes::

      W = 4, S = 2 (nodes {0, 1}, {2, 3}); gradient cut in 4 shards, shard j is owned by rank j
      hop 1, inside node 0:  rank 0 keeps shards 0 and 2 (the ones owned by local index 0) and receives
                             them from rank 1; rank 1 keeps 1 and 3. Each sums its node's two copies.
      hop 2, across:         rank 0 sends its node's sum of shard 2 to rank 2 and receives node 1's
                             sum of shard 0; it adds the two: shard 0 of the sum over all four ranks.

Together, by the paper: 0.5M (int8 of fp16 weights) + 0 + 0.25M (int4 gradients) across nodes where ZeRO-3
moved 3M. The course trains in float32, so its factors are smaller still: int8 is a quarter of float32.

Bytes on each level are counted by the ``Comm`` of each group and measured on the gloo sockets: the world group's
sockets split by the rank at their other end (``traffic.peers_of``), the node's and the cross-node group's whole
(``hsdp.HybridMesh``), as ``hsdp`` does. Quantisation error is reported per step: the largest rounding of a weight
gathered (qwZ) and of a gradient sent (qgZ), each next to its bound.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..network.comm import Comm
from ..network.traffic import Traffic, peers_of, received_from
from .blockwise import dequantize_blocks, error_bound, quantize_blocks
from .hsdp import HybridMesh, _Hybrid, mean_over_steps, node_size
from .knobs import Knob
from .zero3 import Zero3

BLOCK = 256  # values per quantisation block (one float32 scale each: 1.6% on top of int8's bytes)


def quantize_rows(rows: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row of a 2-D tensor block-quantised on its own (a row is one rank's piece of an all-to-all)."""
    pieces = [quantize_blocks(row, BLOCK, bits) for row in rows]
    return torch.stack([c for c, _ in pieces]), torch.stack([s for _, s in pieces])


def dequantize_rows(codes: torch.Tensor, scales: torch.Tensor, numel: int, bits: int) -> torch.Tensor:
    return torch.stack([dequantize_blocks(c, s, numel, BLOCK, bits) for c, s in zip(codes, scales)])


class ZeroPlusPlus(Zero3):
    name = "zeropp"
    label = "zeropp: zero3 + qwZ, hpZ, qgZ"
    colour = "#8172B3"
    exact = False  # with qwZ or qgZ on; hpZ alone is exact (tests/test_frontier.py holds it to zero3)
    emulates_peers = False  # its node groups are real ranks
    takes_all_reduce = ()
    knobs = _Hybrid.knobs + (
        Knob("qwz", True, "quantise the weights' all-gather to int8 blocks (qwZ)", kind=bool),
        Knob("hpz", True, "keep a secondary copy of the weights inside the node for backward (hpZ)", kind=bool),
        Knob("qgz", True, "reduce gradients by quantised all-to-all, inside then across nodes (qgZ)", kind=bool),
        Knob("qgz_bits", 4, "bits per gradient value in qgZ (the paper's 4, or 8)", low=4, high=8))

    @classmethod
    def check(cls, config, world_size: int) -> None:
        super().check(config, world_size)
        knobs = cls.settings(config.knobs)
        if knobs["qgz_bits"] not in (4, 8):
            raise ValueError(f"strategy='zeropp': qgz_bits={knobs['qgz_bits']!r} is not allowed; give 4 or 8")
        node_size(config.link, knobs["hsdp_shard_size"], world_size, cls.name)

    def __init__(self, model, timeline, hsdp_shard_size, qwz, hpz, qgz, qgz_bits, link=None, group=None, **options):
        if group is not None:
            raise ValueError(f"group={group!r} is not allowed with strategy='zeropp': it lays out its own groups over "
                             f"every rank; leave group=None")
        self.qwz, self.hpz, self.qgz, self.qgz_bits = qwz, hpz, qgz, qgz_bits
        self.mesh = HybridMesh(node_size(link, hsdp_shard_size, dist.get_world_size(), self.name))
        self.world_traffic = Traffic()  # a world group of its own, so that its sockets are known
        self.world_traffic.before_world()
        world_group = dist.new_group(list(range(dist.get_world_size())))
        self.world_traffic.world_started()
        counting = self.world_traffic.counts and dist.get_backend() == "gloo"  # the same answer on every rank
        self.peers = peers_of(self.world_traffic, world_group) if counting else {}
        super().__init__(model, timeline, link=link, group=world_group, **options)
        self.node = Comm(link, None, "builtin", timeline, group=self.mesh.groups["shard"])  # the S ranks of my node
        self.cross = Comm(link, None, "builtin", timeline, group=self.mesh.groups["replicate"])  # my index, every node
        s = self.node.size
        mine = self.rank // s
        self.same_node = [r for r in range(self.world) if r // s == mine]
        self.other_nodes = [r for r in range(self.world) if r // s != mine]
        self.secondary = {}  # group -> this rank's 1/S of the layer, kept from forward for backward (hpZ)
        self.phase = "forward"
        self.level_log = []

    # -- gathering the weights: quantised across the world (qwZ), or from the node's secondary copies (hpZ) ----
    def _before_forward(self, group):
        gather = super()._before_forward(group)

        def hook(module, inputs):
            self.phase = "forward"
            return gather(module, inputs)
        return hook

    def _before_backward(self, group):
        gather = super()._before_backward(group)

        def hook(grad):
            self.phase = "backward"
            return gather(grad)
        return hook

    def _after_forward(self, group):
        free = super()._after_forward(group)

        def hook(module, inputs, output):
            if self.hpz and not self.reporting and torch.is_grad_enabled():  # keep my 1/S before the layer goes
                piece = group.flat.view(self.node.size, -1)[self.node.rank].clone()
                self.hold(piece.numel() * piece.element_size())
                self.secondary[group] = piece
            return free(module, inputs, output)
        return hook

    def _start_gather(self, group):
        if not self.reporting and self.phase == "backward" and group in self.secondary:  # hpZ: the node's S ranks
            piece = self.secondary.pop(group)
            work = self.node.all_gather_into_tensor(group.flat, piece, async_op=True)
            self.node.launched(work, "all_gather (node)")
            self.release(piece.numel() * piece.element_size())
            return [(self.node, work)], None
        if self.reporting or not self.qwz:
            return super()._start_gather(group)  # float32 across the world, as zero3 (and the final report)
        codes, scales = quantize_blocks(group.shard.detach(), BLOCK, 8)  # qwZ
        all_codes = codes.new_empty(codes.numel() * self.world)
        all_scales = scales.new_empty(scales.numel() * self.world)
        works = [self.comm.all_gather_into_tensor(all_codes, codes, async_op=True),
                 self.comm.all_gather_into_tensor(all_scales, scales, async_op=True)]
        for work in works:
            self.comm.launched(work, "all_gather (int8)")
        return [(self.comm, w) for w in works], (all_codes, all_scales)

    def _finish_gather(self, group, started) -> None:
        if not isinstance(started, tuple):
            return super()._finish_gather(group, started)
        works, quantised = started
        for comm, work in works:
            comm.wait(work)
        if quantised is not None:  # every rank's piece, decoded: the same weights on every rank
            codes, scales = quantised[0], quantised[1].view(self.world, -1)
            pieces = dequantize_rows(codes.view(self.world, -1), scales, group.shard_numel, 8)
            group.flat.view(self.world, -1).copy_(pieces)
            me = slice(self.rank, self.rank + 1)  # my own piece, as every rank decoded it, against my shard
            self._note_error("qwz", group.shard.detach()[None], pieces[me], scales[me])

    # -- reducing the gradients: two quantised all-to-alls (qgZ) -------------------------------------------
    def launch_reduce_scatter(self, group) -> None:
        if not self.qgz:
            return super().launch_reduce_scatter(group)
        full = group.flat_gradient()
        for p in group.params:
            p.grad = None
        self.hold(full.numel() * full.element_size())
        full.div_(self.world)
        s, r, m = self.node.size, self.cross.size, group.shard_numel
        # hop 1: row l holds the shards owned by local index l, one per node; trade rows inside the node and sum
        rows = full.view(r, s, m).transpose(0, 1).reshape(s, r * m)
        partial = self._all_to_all_sum(self.node, rows, "qgZ inside")
        # hop 2: row n is my node's sum of the shard owned by my local index in node n; trade across and sum
        group.grad_shard.copy_(self._all_to_all_sum(self.cross, partial.view(r, m), "qgZ across"))
        group.shard.grad = group.grad_shard
        self.release(full.numel() * full.element_size())

    def _all_to_all_sum(self, comm: Comm, rows: torch.Tensor, name: str) -> torch.Tensor:
        """Send row i to the group's rank i, quantised; return the sum of the rows received, decoded."""
        numel = rows.shape[1]
        with self.overhead(self.step, "quantise"):
            codes, scales = quantize_rows(rows, self.qgz_bits)
            self._note_error("qgz", rows, dequantize_rows(codes, scales, numel, self.qgz_bits), scales)
        got_codes, got_scales = torch.empty_like(codes), torch.empty_like(scales)
        with comm.exchange(name):
            comm.all_to_all_single(got_codes, codes)
            comm.all_to_all_single(got_scales, scales)
        with self.overhead(self.step, "dequantise"):
            return dequantize_rows(got_codes, got_scales, numel, self.qgz_bits).sum(dim=0)

    def _note_error(self, part: str, exact, decoded, scales) -> None:
        """Keep the largest rounding error of ``part`` so far, and its share of the bound (half its block's step:
        ``blockwise.error_bound``), which must never pass 1."""
        error = (exact - decoded).abs()  # one row per piece sent, each with its own blocks and scales
        bound = torch.stack([error_bound(s, BLOCK, error.shape[1]) for s in scales])
        errors = self.notes.setdefault("quantisation", {}).setdefault(part, {"max_error": 0.0, "of_bound": 0.0})
        errors["max_error"] = max(errors["max_error"], float(error.max()))
        errors["of_bound"] = max(errors["of_bound"], float((error / bound).max()))

    # -- the step: bytes on each level, counted and measured -------------------------------------------
    @property
    def wire_bytes(self) -> int:
        return self.comm.sent + self.node.sent + self.cross.sent

    def start_step(self, step: int) -> None:
        quantisation = (self.notes or {}).get("quantisation", {})
        super().start_step(step)
        self.notes["quantisation"] = quantisation  # the largest error over the run so far
        self.node.new_step(step)
        self.cross.new_step(step)
        self._received_before = self._received()

    def _received(self) -> dict:
        groups = self.mesh.received()
        if groups["shard"] is None:
            return {"inside": None, "between": None}
        return {"inside": groups["shard"] + received_from(self.world_traffic, self.peers, self.same_node),
                "between": groups["replicate"] + received_from(self.world_traffic, self.peers, self.other_nodes)}

    def step_optimizer(self, optimizer) -> None:
        super().step_optimizer(optimizer)
        now = self._received()
        received = {k: None if now[k] is None else now[k] - self._received_before[k] for k in now}
        comms = (self.comm, self.node, self.cross)
        self.level_log.append({"sent_between": sum(c.sent_between or 0 for c in comms) if self.comm.levels else None,
                               "sent_inside": sum(c.sent_inside or 0 for c in comms) if self.comm.levels else None,
                               "received_between": received["between"], "received_inside": received["inside"],
                               "expected_between": None, "expected_inside_gloo": None})
        self.notes = {**self.notes, "bytes_per_step": mean_over_steps(self.level_log), "steps": len(self.level_log),
                      "parts": {"qwz": self.qwz, "hpz": self.hpz, "qgz": self.qgz, "qgz_bits": self.qgz_bits},
                      "shard_size": self.node.size, "replicas": self.cross.size}
