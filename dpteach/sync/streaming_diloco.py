"""``streaming_diloco``: DiLoCo's outer step one fragment of the model at a time, overlapped, in 4 bits.

Douillard et al., "Streaming DiLoCo with overlapping communication: Towards a Distributed Free Lunch" (2025): its
streaming partial updates, their overlap and the quantised exchange. DiLoCo (``diloco.py``) all-reduces the whole
model's pseudo-gradient every H steps: between those moments the network idles, and at them it must carry the
whole model at once, which sets the bandwidth a cluster needs. Streaming DiLoCo changes three things, each a knob
here:

* **Fragments** (``fragments``, P): the model's layers are dealt into P fragments, layer i to fragment i mod P
  (the paper's strided pattern), and fragment p is synchronised every H steps like DiLoCo, but shifted by
  p x H / P steps. The same bytes over H steps, in P exchanges of about 1/P of the model each: the peak falls
  by P::

      H = 8, P = 4:   step  1  3  5  7  9 11 13 15 ...  (fragment 3, 2, 1, 0, 3, 2, 1, 0: one every H/P steps)

* **Overlap** (``overlap_steps``, tau): the fragment's exchange is launched and the ranks go on with tau inner
  steps before they need its result, so a slow link has tau steps of compute to hide behind. Meanwhile the
  fragment trained on: when the outer step arrives, the fragment becomes a mix of the two,
  ``theta = mix x theta_local + (1 - mix) x theta_outer`` (``mix``: the paper's alpha, 0.5 in its runs).
* **Fewer bits** (``outer_bits``): the pseudo-gradient travels in 4 bits (the paper uses a 4-bit float, E3M0;
  the course, lesson 16's block-quantised integers, ``blockwise.py``). 4-bit values cannot be summed in 4 bits,
  so the ranks all-gather them and each decodes and averages the W pieces in float32 (lesson 06's int8 does the
  same); ``outer_bits=32`` all-reduces in float32 as DiLoCo does.

With P = 1, tau = 0, 32 bits and mix = 0 this is DiLoCo, step for step (``tests/test_frontier.py`` holds it).
"""
from __future__ import annotations

import torch
from torch.nn.utils import parameters_to_vector

from .blockwise import dequantize_blocks, quantize_blocks
from .diloco import DiLoCo
from .knobs import Knob
from .local_sgd import LocalSGD, copy_into_parameters
from .sharding import parameter_units, unit_parameters

BLOCK = 256  # values per quantisation block


class StreamingDiLoCo(DiLoCo):
    name = "streaming_diloco"
    label = "streaming DiLoCo (fragments, overlap, 4 bits)"
    colour = "#C44E52"
    emulates_peers = False  # its all-gather of 4-bit pieces needs every rank's own
    knobs = DiLoCo.knobs + (
        Knob("fragments", 4, "fragments of the model, synchronised in turn (P)", low=1),
        Knob("overlap_steps", 1, "inner steps taken while a fragment's exchange travels (tau)", low=0),
        Knob("outer_bits", 4, "bits per value of the pseudo-gradient: 4, 8, or 32 (float32, all-reduced)",
             low=4, high=32),
        Knob("mix", 0.5, "share of the locally trained fragment kept when the outer step lands (alpha)",
             kind=float, low=0, high=1))

    @classmethod
    def check(cls, config, world_size: int) -> None:
        super().check(config, world_size)
        k = cls.settings(config.knobs)
        if k["outer_bits"] not in (4, 8, 32):
            raise ValueError(f"strategy='streaming_diloco': outer_bits={k['outer_bits']!r} is not allowed; "
                             f"give 4, 8 or 32")
        if k["fragments"] > k["sync_every"]:
            raise ValueError(f"strategy='streaming_diloco': fragments={k['fragments']} is not allowed with "
                             f"sync_every={k['sync_every']}: the fragments take turns within H steps; give at most "
                             f"{k['sync_every']}")
        spacing = k["sync_every"] // k["fragments"]
        if k["overlap_steps"] and k["overlap_steps"] >= spacing:
            raise ValueError(f"strategy='streaming_diloco': overlap_steps={k['overlap_steps']} is not allowed: a "
                             f"fragment's result must land before the next fragment is sent, every "
                             f"{spacing} steps; give less than {spacing}")

    def __init__(self, model, timeline, outer_lr, outer_momentum, fragments, overlap_steps, outer_bits, mix,
                 **options):
        LocalSGD.__init__(self, model, timeline, **options)  # DiLoCo's one anchor becomes one per fragment
        units = parameter_units(model)
        count = min(fragments, len(units))
        self.fragments = [[p for u in units[i::count] for p in unit_parameters(u)] for i in range(count)]
        with torch.no_grad():
            self.anchors = [parameters_to_vector(ps).detach().clone() for ps in self.fragments]
        self.outers = [torch.optim.SGD([a], lr=outer_lr, momentum=outer_momentum, nesterov=outer_momentum > 0)
                       for a in self.anchors]
        self.overlap, self.bits, self.mix = overlap_steps, outer_bits, mix
        self.spacing = self.sync_every // count
        self.pending = []  # (step to land at, fragment, work handles, what to decode)

    def held_tensors(self) -> list:
        momenta = [t for o, a in zip(self.outers, self.anchors) for t in o.state[a].values() if torch.is_tensor(t)]
        return LocalSGD.held_tensors(self) + self.anchors + momenta

    def due(self, step: int) -> list[int]:
        """The fragments whose exchange starts after inner step ``step``: fragment p every H steps, p x H/P late."""
        return [p for p in range(len(self.fragments)) if (step + 1 + p * self.spacing) % self.sync_every == 0]

    def synchronises_after(self, step: int) -> bool:
        """A fragment is sent after this step, or one sent earlier lands."""
        return bool(self.due(step)) or any(at <= step for at, *_ in self.pending)

    def synchronise(self, step: int) -> None:
        for p in self.due(step):
            self._send(p, step)
        for item in [i for i in self.pending if i[0] <= step]:  # with tau = 0, the one just sent
            self.pending.remove(item)
            self._land(*item[1:])

    def _send(self, p: int, step: int) -> None:
        with torch.no_grad():
            with self.overhead(step, "pack"):
                delta = self.anchors[p] - parameters_to_vector(self.fragments[p])  # this rank's outer gradient
            if self.bits == 32:
                if self.world > 1:
                    delta.div_(self.world)
                works, decode = [self.comm.all_reduce(delta, async_op=True)], delta
            else:
                with self.overhead(step, "quantise"):
                    codes, scales = quantize_blocks(delta, BLOCK, self.bits)
                every = (codes.new_empty(codes.numel() * self.world), scales.new_empty(scales.numel() * self.world))
                works = [self.comm.all_gather_into_tensor(every[0], codes, async_op=True),
                         self.comm.all_gather_into_tensor(every[1], scales, async_op=True)]
                decode = (every, delta.numel())
            for work in works:
                self.comm.launched(work, f"fragment {p}")
        self.pending.append((step + self.overlap, p, works, decode))

    def _land(self, p: int, works: list, decode) -> None:
        with self.comm.waiting():
            for work in works:
                self.comm.wait(work)
        with torch.no_grad(), self.overhead(self.step, "outer step"):
            if self.bits == 32:
                mean = decode
            else:
                (codes, scales), numel = decode
                pieces = [dequantize_blocks(c, s, numel, BLOCK, self.bits)
                          for c, s in zip(codes.view(self.world, -1), scales.view(self.world, -1))]
                mean = torch.stack(pieces).mean(dim=0)
            self.anchors[p].grad = mean
            self.outers[p].step()
            self.anchors[p].grad = None
            mixed = self.anchors[p] if self.mix == 0 else (
                self.mix * parameters_to_vector(self.fragments[p]) + (1 - self.mix) * self.anchors[p])
            copy_into_parameters(mixed, self.fragments[p])

    def close(self) -> None:
        for _, _, works, _ in self.pending:  # exchanges still travelling when the run ended: let them finish
            for work in works:
                self.comm.wait(work)
        self.pending = []
        super().close()
