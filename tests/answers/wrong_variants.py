"""Known-wrong solutions, for the grader's own tests: each must lose points, on the check meant to catch it.

A grader that gives full marks to a broken ring is worse than none. Each variant here is a reference
solution (``solutions.py``) with one realistic mistake put in by a textual edit - an off-by-one chunk
index, a missing division by W, a sync decided after forward, a hook that reduces the parameter instead
of its gradient, a bucket whose state outlives its step - together with the checks that must fail
because of it (matched by a piece of their name) and the words the failure message must contain.
``tests/test_grading_variants.py`` grades every one.

Not imported by the grader itself.
"""
from __future__ import annotations

from dataclasses import dataclass

from answers.solutions import solution
from dpteach.grading.spec import get_exercise


@dataclass(frozen=True)
class Variant:
    exercise: str
    name: str
    edits: tuple            # ((old text, new text), ...) applied to the reference solution, each exactly once
    must_fail: tuple        # pieces of the names of checks that must fail
    message: str = ""       # a piece of the failure message of the first of them

    def source(self) -> str:
        text = solution(self.exercise)
        for old, new in self.edits:
            if text.count(old) != 1:
                raise AssertionError(f"variant {self.name!r}: {old!r} occurs {text.count(old)} times in the solution")
            text = text.replace(old, new)
        return text

    def failing_checks(self) -> list[int]:
        checks = get_exercise(self.exercise).checks
        found = [i for i, check in enumerate(checks) if any(piece in check.name for piece in self.must_fail)]
        if len(found) < len(self.must_fail):
            raise AssertionError(f"variant {self.name!r}: not every piece of {self.must_fail} names a check")
        return found


NAIVE_ALL_REDUCE = '''\
def ring_all_reduce(tensor):
    world, rank = dist.get_world_size(), dist.get_rank()
    buf = tensor.detach().contiguous().view(-1)
    if rank == 0:                              # gather to rank 0, add, send the sum back
        inbox = torch.empty_like(buf)
        for src in range(1, world):
            exchange(None, None, inbox, src)
            buf += inbox
        for dst in range(1, world):
            exchange(buf, dst, None, None)
    else:
        exchange(buf, 0, None, None)
        exchange(None, None, buf, 0)
    if buf.data_ptr() != tensor.data_ptr() or not tensor.is_contiguous():
        tensor.copy_(buf.view(tensor.shape))
    return tensor
'''

GATHER_TO_RANK_0 = '''\
def save_checkpoint(run, directory, step):
    """The mistake: every momentum shard gathered to rank 0, which writes the whole run into one file."""
    gathered = []
    for group in run.groups:
        pieces = [torch.empty_like(group.shard) for _ in range(run.world)] if run.rank == 0 else None
        dist.gather(run.optimizer.state[group.shard]["momentum_buffer"], pieces, dst=0)
        if run.rank == 0:
            gathered.append(torch.cat(pieces)[:sum(p.numel() for p in group.params)])
    generators = [None] * run.world
    dist.all_gather_object(generators, torch.get_rng_state())
    if run.rank == 0:
        torch.save({"step": step, "model": run.model.state_dict(), "momentum": gathered, "rng": generators,
                    "sampler": run.sampler.state_dict()}, os.path.join(directory, f"step-{step:06d}.pt"))
    dist.barrier()


def load_checkpoint(run, directory):
    names = sorted(name for name in os.listdir(directory) if name.endswith(".pt"))
    if not names:
        return 0
    saved = torch.load(os.path.join(directory, names[-1]), weights_only=False)
    run.model.load_state_dict(saved["model"])
    for group, whole in zip(run.groups, saved["momentum"]):
        n = group.shard_numel
        padded = torch.zeros(n * run.world)
        padded[:whole.numel()] = whole
        run.optimizer.state[group.shard]["momentum_buffer"] = padded[run.rank * n:(run.rank + 1) * n].clone()
    if run.rank < len(saved["rng"]):
        torch.set_rng_state(saved["rng"][run.rank])
    run.sampler.load_state_dict(saved["sampler"])
    return saved["step"]
'''
_CHECKPOINT = solution("10")

VARIANTS = (
    Variant("01", "off-by-one chunk index in reduce-scatter",
            (("bounds[(rank - step - 1) % world]\n        r0, r1 = bounds[(rank - step - 2) % world]\n        "
              "exchange(buf[s0:s1], right, inbox",
              "bounds[(rank - step) % world]\n        r0, r1 = bounds[(rank - step - 1) % world]\n        "
              "exchange(buf[s0:s1], right, inbox"),),
            ("reduce_scatter: W=2, 8 elements",), "rank"),
    Variant("01", "all-gather that sends the chunk it is about to receive",
            (("s0, s1 = bounds[(rank - step) % world]\n        r0, r1 = bounds[(rank - step - 1) % world]\n"
              "        exchange(out[s0:s1]",
              "s0, s1 = bounds[(rank - step - 1) % world]\n        r0, r1 = bounds[(rank - step - 1) % world]\n"
              "        exchange(out[s0:s1]"),),
            ("all_gather: W=3",), "rank"),
    Variant("02", "off-by-one chunk index in the all-gather pass",
            (("s0, s1 = bounds[(rank - step) % world]", "s0, s1 = bounds[(rank - step + 1) % world]"),),
            ("W=3, 10 elements",), "rank"),
    Variant("02", "works on a copy: the caller's tensor never changes",
            (("buf = tensor.detach().contiguous().view(-1)", "buf = tensor.detach().reshape(-1).clone()"),
             ("    if buf.data_ptr() != tensor.data_ptr() or not tensor.is_contiguous():\n"
              "        tensor.copy_(buf.view(tensor.shape))\n    return tensor",
              "    return buf.view(tensor.shape)")),
            ("W=2, 8 elements, float32, in place",), "in place"),
    Variant("02", "gather to rank 0 and broadcast back: right sum, not a ring",
            ((solution("02")[solution("02").index("def ring_all_reduce"):], NAIVE_ALL_REDUCE),),
            ("sends 2(W-1)/W of the tensor",), "more elements than a ring"),
    Variant("03", "closes a bucket before the parameter that crosses the cap",
            (("        current.append(index)\n        filled += sizes[index]\n",
              "        if current and filled + sizes[index] > (cap_bytes if buckets else first_cap_bytes):\n"
              "            buckets.append(current)\n            current, filled = [], 0\n"
              "        current.append(index)\n        filled += sizes[index]\n"),),
            ("crosses the cap joins",), "closed before"),
    Variant("03", "fills buckets in forward order",
            (("for index in reversed(range(len(sizes))):", "for index in range(len(sizes)):"),),
            ("reverse order, equal sizes",), "reverse"),
    Variant("03", "flatten returns copies instead of views",
            (("views.append(view)", "views.append(view.clone())"),),
            ("views share the buffer",), "views"),
    Variant("04", "the hook reduces the parameter instead of its gradient",
            (("view.copy_(param.grad)", "view.copy_(param.detach())"),),
            ("every .grad is the average",), "average"),
    Variant("04", "missing division by W",
            (("p.grad.copy_(view / world)", "p.grad.copy_(view)"),),
            ("every .grad is the average",), "divide by W"),
    Variant("04", "stale bucket: per-step state never reset",
            (("            p.grad.copy_(view / world)\n        self.reset()\n",
              "            p.grad.copy_(view / world)\n"),),
            ("three steps in a row",), "step 2 of 3"),
    Variant("04", "launches every all-reduce in finish(): no overlap",
            (("        while self.next_bucket < len(self.buckets) and self.missing[self.next_bucket] == 0:\n",
              "        while False:\n"),
             ("    def finish(self):\n",
              "    def finish(self):\n        for b in range(len(self.buckets)):\n"
              "            self.handles.append(dist.all_reduce(self.buffers[b], async_op=True))\n")),
            ("starts during backward",), "after backward"),
    Variant("04", "launches each bucket as soon as it is complete, out of bucket order",
            (("        self.fired.add(param)\n        self.missing[b] -= 1\n        self.launch_ready()\n",
              "        self.fired.add(param)\n        self.missing[b] -= 1\n"
              "        if self.missing[b] == 0:  # at once, whatever the buckets before it\n"
              "            self.handles.append(dist.all_reduce(self.buffers[b], async_op=True))\n"
              "            self.next_bucket += 1\n"),),
            ("complete out of order on one rank", "in a different order on different ranks"), "launched after bucket"),
    Variant("05", "sync decided after forward",
            (("        with context:                       # decided before forward\n"
              "            loss = loss_fn(model(inputs), targets) / k\n            loss.backward()\n",
              "        loss = loss_fn(model(inputs), targets) / k\n"
              "        with context:                       # too late: forward already armed the sync\n"
              "            loss.backward()\n"),),
            ("synchronised once per step",), "more than once"),
    Variant("05", "loss not divided by K",
            (("loss = loss_fn(model(inputs), targets) / k", "loss = loss_fn(model(inputs), targets)"),),
            ("weights after one step",), "weights differ"),
    Variant("06", "error feedback that forgets the residual",
            (("corrected = grad + residual", "corrected = grad"),),
            ("the new residual is what", "add up to the true sum"), "residual"),
    Variant("06", "truncates instead of rounding",
            (("torch.round(blocks / scales[:, None])", "(blocks / scales[:, None])"),),
            ("within half a step",), "half a step"),
    Variant("07", "staleness bound never enforced",
            (("applied = max_staleness is None or version - used <= max_staleness", "applied = True"),),
            ("max_staleness=0",), "staler than max_staleness"),
    Variant("07", "worker ignores the weights the server sends back",
            (("        vector_to_parameters(reply[1:], params)\n", ""),),
            ("equal replaying the log",), "replaying"),
    Variant("08", "missing division by W",
            (("mine = ring_reduce_scatter(grads) / world", "mine = ring_reduce_scatter(grads)"),),
            ("three steps equal SGD",), "weights differ"),
    Variant("09", "missing division by W",
            (("self.grad = ring_reduce_scatter(flat) / self.world", "self.grad = ring_reduce_scatter(flat)"),),
            ("slice of the averaged gradient", "three steps equal SGD"), "divide by W"),
    Variant("09", "full gradients never freed",
            (("        for p in self.params:\n            p.grad = None\n", ""),),
            ("no .grad is left",), "still has a .grad"),
    Variant("09", "keeps the full flat gradient between calls",
            (("flat = torch.cat([p.grad.reshape(-1) for p in self.params])",
              "self.flat = flat = torch.cat([p.grad.reshape(-1) for p in self.params])"),),
            ("no .grad is left",), "full-length buffer"),
    Variant("09", "momentum kept for the whole vector, its slice a view",
            (("self.buf = torch.zeros(self.stop - self.start, dtype=self.params[0].dtype)",
              "self.state = torch.zeros(total, dtype=self.params[0].dtype)\n"
              "        self.buf = self.state[self.start:self.stop]"),),
            ("momentum_slice() is this rank's slice",), "view into a larger buffer"),
    Variant("09", "all-gathers every rank's full gradient instead of reduce-scattering",
            (("self.grad = ring_reduce_scatter(flat) / self.world",
              "self.grad = ring_all_gather(flat).view(self.world, -1)[:, self.start:self.stop].sum(0) / self.world"),),
            ("no more traffic",), "sent more elements"),
    Variant("10", "no optimizer state saved: the momentum is lost",
            ((_CHECKPOINT[_CHECKPOINT.index("    for i, group in"):_CHECKPOINT.index("    return state")], ""),),
            ("momentum shard comes back",), "no momentum"),
    Variant("10", "no RNG state saved: each rank's input noise starts over",
            (("    state[f\"rng/{run.rank}\"] = torch.get_rng_state()            # this rank's input noise\n", ""),),
            ("random generator comes back",), "random generator"),
    Variant("10", "the sampler's place not saved: the data restarts at epoch 0",
            (("    state[\"sampler\"] = run.sampler                              # where the data stream is\n", ""),),
            ("goes on where it stopped",), "epoch 0, batch 0"),
    Variant("10", "rank 0 gathers the optimizer shards and writes everything",
            ((_CHECKPOINT[_CHECKPOINT.index("def save_checkpoint"):], GATHER_TO_RANK_0),),
            ("writes its own shard",), "gathered to it"),
    Variant("11", "all-gathers the float32 shard: exact values, four times the bytes",
            (("    dist.all_gather(every_codes, codes)                         # 1 byte per value\n"
              "    dist.all_gather(every_scales, scales)                       # 4 bytes per block\n"
              "    return torch.cat([dequantize_blocks(c, s, numel, block) for c, s in zip(every_codes, every_scales)])",
              "    values = [torch.empty(numel) for _ in range(world)]\n"
              "    dist.all_gather(values, shard.float())\n    return torch.cat(values)"),),
            ("quantized_all_gather",), "bytes reached this rank"),
    Variant("11", "decodes every piece with its own scales: the scales never sent",
            (("    dist.all_gather(every_scales, scales)                       # 4 bytes per block\n",
              "    every_scales = [scales] * world\n"),),
            ("quantized_all_gather",), "decoded with the scales of the rank that sent it"),
    Variant("11", "one scale for the whole tensor",
            (("scales = grid.abs().amax(dim=1) / 127", "scales = grid.abs().amax().repeat(rows) / 127"),),
            ("int8 codes padded to whole blocks", "round trip", "quantized_all_gather, W=2"),
            "one scale for the whole tensor"),
    Variant("11", "truncates instead of rounding",
            (("torch.round(grid / scales.unsqueeze(1))", "(grid / scales.unsqueeze(1))"),),
            ("round trip",), "half a step"),
    Variant("11", "keeps its own piece in float32: the ranks hold different weights",
            (("    return torch.cat([dequantize_blocks(c, s, numel, block) for c, s in zip(every_codes, every_scales)])",
              "    pieces = [dequantize_blocks(c, s, numel, block) for c, s in zip(every_codes, every_scales)]\n"
              "    pieces[dist.get_rank()] = shard.float()\n    return torch.cat(pieces)"),),
            ("quantized_all_gather, W=2",), "returned different tensors"),
)
