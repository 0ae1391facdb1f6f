"""Reference solutions, one solution cell per exercise - for the tests and for instructors, not for learners.

Each entry is the text of a complete ``solution`` cell, exactly as a learner would write it, so the tests
grade it through the same path as a learner's notebook (``tests/test_grading_solutions.py`` fills it into
a copy of the exercise notebook and runs ``dpteach grade --json``: every one must score full marks).

They are written afresh rather than borrowed from ``dpteach.collectives`` or ``dpteach.sync``: the
exercises forbid calling those, and the grader would rightly give a borrowed answer zero.

If you are a learner and reading this: the exercises teach more if you close this file now.
"""
from __future__ import annotations

from dpteach.grading.spec import get_exercise

SOLUTIONS: dict[str, str] = {}

SOLUTIONS["01"] = '''\
import torch
import torch.distributed as dist
from dpteach.collectives import chunk_bounds, exchange


def reduce_scatter(tensor):
    world, rank = dist.get_world_size(), dist.get_rank()
    buf = tensor.detach().reshape(-1).clone()
    bounds = chunk_bounds(buf.numel(), world)
    inbox = torch.empty(max(b - a for a, b in bounds), dtype=buf.dtype)
    right, left = (rank + 1) % world, (rank - 1) % world
    for step in range(world - 1):
        s0, s1 = bounds[(rank - step - 1) % world]
        r0, r1 = bounds[(rank - step - 2) % world]
        exchange(buf[s0:s1], right, inbox[:r1 - r0], left)
        buf[r0:r1] += inbox[:r1 - r0]
    start, stop = bounds[rank]
    return buf[start:stop].clone()


def all_gather(chunk, numel):
    world, rank = dist.get_world_size(), dist.get_rank()
    bounds = chunk_bounds(numel, world)
    out = torch.empty(numel, dtype=chunk.dtype)
    start, stop = bounds[rank]
    out[start:stop] = chunk.reshape(-1)
    right, left = (rank + 1) % world, (rank - 1) % world
    for step in range(world - 1):
        s0, s1 = bounds[(rank - step) % world]
        r0, r1 = bounds[(rank - step - 1) % world]
        exchange(out[s0:s1], right, out[r0:r1], left)
    return out
'''

SOLUTIONS["02"] = '''\
import torch
import torch.distributed as dist
from dpteach.collectives import chunk_bounds, exchange


def ring_all_reduce(tensor):
    world, rank = dist.get_world_size(), dist.get_rank()
    buf = tensor.detach().contiguous().view(-1)   # the tensor itself when it is contiguous
    bounds = chunk_bounds(buf.numel(), world)
    right, left = (rank + 1) % world, (rank - 1) % world
    inbox = torch.empty(max(b - a for a, b in bounds), dtype=buf.dtype)
    for step in range(world - 1):                  # reduce-scatter
        s0, s1 = bounds[(rank - step - 1) % world]
        r0, r1 = bounds[(rank - step - 2) % world]
        exchange(buf[s0:s1], right, inbox[:r1 - r0], left)
        buf[r0:r1] += inbox[:r1 - r0]
    for step in range(world - 1):                  # all-gather
        s0, s1 = bounds[(rank - step) % world]
        r0, r1 = bounds[(rank - step - 1) % world]
        exchange(buf[s0:s1], right, buf[r0:r1], left)
    if buf.data_ptr() != tensor.data_ptr() or not tensor.is_contiguous():
        tensor.copy_(buf.view(tensor.shape))
    return tensor
'''


SOLUTIONS["03"] = '''\
import torch


def assign_buckets(sizes, cap_bytes, first_cap_bytes):
    buckets, current, filled = [], [], 0
    for index in reversed(range(len(sizes))):
        current.append(index)
        filled += sizes[index]
        if filled >= (cap_bytes if buckets else first_cap_bytes):
            buckets.append(current)
            current, filled = [], 0
    if current:
        buckets.append(current)
    return buckets


def flatten(grads):
    flat = torch.empty(sum(g.numel() for g in grads), dtype=grads[0].dtype if grads else torch.float32)
    views, offset = [], 0
    for g in grads:
        view = flat[offset:offset + g.numel()].view(g.shape)
        view.copy_(g)
        views.append(view)
        offset += g.numel()
    return flat, views
'''

SOLUTIONS["04"] = '''\
import torch
import torch.distributed as dist


class OverlapSync:
    def __init__(self, model, buckets):
        self.buckets = buckets
        self.buffers, self.where = [], {}
        for b, params in enumerate(buckets):
            flat = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype)
            offset = 0
            for p in params:
                self.where[p] = (b, flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
            self.buffers.append(flat)
        for p in self.where:
            p.register_post_accumulate_grad_hook(self.hook)
        self.reset()

    def reset(self):
        self.missing = [len(params) for params in self.buckets]
        self.next_bucket = 0
        self.handles = []
        self.fired = set()

    def hook(self, param):
        b, view = self.where[param]
        view.copy_(param.grad)
        self.fired.add(param)
        self.missing[b] -= 1
        self.launch_ready()

    def launch_ready(self):  # in bucket order only: the next bucket, as long as it is complete
        while self.next_bucket < len(self.buckets) and self.missing[self.next_bucket] == 0:
            self.handles.append(dist.all_reduce(self.buffers[self.next_bucket], async_op=True))
            self.next_bucket += 1

    def finish(self):
        for p, (b, view) in self.where.items():  # no gradient this step: contribute zeros
            if p not in self.fired:
                view.zero_()
                self.missing[b] -= 1
        self.launch_ready()
        for handle in self.handles:
            handle.wait()
        world = dist.get_world_size()
        for p, (b, view) in self.where.items():
            if p.grad is None:
                p.grad = view / world
            else:
                p.grad.copy_(view / world)
        self.reset()
'''

SOLUTIONS["05"] = '''\
import contextlib

import torch


def train_step(model, micro_batches, optimizer, loss_fn):
    k = len(micro_batches)
    total = 0.0
    for i, (inputs, targets) in enumerate(micro_batches):
        context = model.no_sync() if i < k - 1 else contextlib.nullcontext()
        with context:                       # decided before forward
            loss = loss_fn(model(inputs), targets) / k
            loss.backward()
        total += loss.item()
    optimizer.step()
    optimizer.zero_grad()
    return total
'''

SOLUTIONS["06"] = '''\
import torch


def quantize(x, chunk):
    flat = x.detach().reshape(-1).to(torch.float32)
    n = flat.numel()
    chunks = -(-n // chunk)
    padded = torch.zeros(chunks * chunk)
    padded[:n] = flat
    blocks = padded.view(chunks, chunk)
    scales = blocks.abs().amax(dim=1) / 127
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = torch.round(blocks / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q.view(-1)[:n].clone(), scales


def dequantize(q, scales, chunk):
    steps = scales.to(torch.float32).repeat_interleave(chunk)[:q.numel()]
    return q.reshape(-1).to(torch.float32) * steps


def compress_with_feedback(grad, residual, chunk):
    corrected = grad + residual
    q, scales = quantize(corrected, chunk)
    return q, scales, corrected - dequantize(q, scales, chunk)
'''

SOLUTIONS["07"] = '''\
import torch
import torch.distributed as dist
from torch.nn.utils import parameters_to_vector, vector_to_parameters


def serve(model, optimizer, pushes, max_staleness):
    params = list(model.parameters())
    inbox = torch.empty(1 + sum(p.numel() for p in params))
    version, log = 0, []
    for _ in range(pushes):
        sender = dist.recv(inbox)                 # from whichever worker is first
        used = int(inbox[0].item())
        applied = max_staleness is None or version - used <= max_staleness
        if applied:
            offset = 1
            for p in params:
                p.grad = inbox[offset:offset + p.numel()].view_as(p).clone()
                offset += p.numel()
            optimizer.step()
            version += 1
        reply = torch.cat([torch.tensor([float(version)]), parameters_to_vector(params).detach()])
        dist.send(reply, sender)
        log.append((sender, used, applied))
    return log


def work(model, compute_gradient, updates):
    params = list(model.parameters())
    version = 0
    for i in range(updates):
        compute_gradient(i)
        grad = parameters_to_vector([p.grad for p in params]).detach()
        message = torch.cat([torch.tensor([float(version)]), grad])
        dist.send(message, 0)
        reply = torch.empty_like(message)
        dist.recv(reply, 0)
        version = int(reply[0].item())
        vector_to_parameters(reply[1:], params)
'''

SOLUTIONS["08"] = '''\
import torch
import torch.distributed as dist
from dpteach.collectives import chunk_bounds, ring_all_gather, ring_reduce_scatter


class ZeroSGD:
    def __init__(self, params, lr, momentum):
        self.params, self.lr, self.momentum = list(params), lr, momentum
        total = sum(p.numel() for p in self.params)
        self.start, self.stop = chunk_bounds(total, dist.get_world_size())[dist.get_rank()]
        self.buf = torch.zeros(self.stop - self.start, dtype=self.params[0].dtype)

    def step(self):
        world = dist.get_world_size()
        grads = torch.cat([p.grad.reshape(-1) for p in self.params])
        mine = ring_reduce_scatter(grads) / world
        flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.buf.mul_(self.momentum).add_(mine)
        updated = flat[self.start:self.stop] - self.lr * self.buf
        full = ring_all_gather(updated)
        offset = 0
        with torch.no_grad():
            for p in self.params:
                p.copy_(full[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    def state_numel(self):
        return self.buf.numel()
'''


SOLUTIONS["09"] = '''\
import torch
import torch.distributed as dist
from dpteach.collectives import chunk_bounds, ring_all_gather, ring_reduce_scatter


class Zero2SGD:
    def __init__(self, params, lr, momentum):
        self.params, self.lr, self.momentum = list(params), lr, momentum
        self.world = dist.get_world_size()
        total = sum(p.numel() for p in self.params)
        self.start, self.stop = chunk_bounds(total, self.world)[dist.get_rank()]
        self.buf = torch.zeros(self.stop - self.start, dtype=self.params[0].dtype)
        self.grad = None

    def reduce_gradients(self):
        flat = torch.cat([p.grad.reshape(-1) for p in self.params])
        self.grad = ring_reduce_scatter(flat) / self.world
        for p in self.params:
            p.grad = None

    def step(self):
        flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.buf.mul_(self.momentum).add_(self.grad)
        updated = flat[self.start:self.stop] - self.lr * self.buf
        full = ring_all_gather(updated)
        offset = 0
        with torch.no_grad():
            for p in self.params:
                p.copy_(full[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    def grad_slice(self):
        return self.grad

    def momentum_slice(self):
        return self.buf
'''


SOLUTIONS["10"] = '''\
import os
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard


def _state(run, step):
    """What the run needs, as DCP saves and loads it: the weights (written once: every rank holds the same),
    the sampler, this rank's generator, and each momentum shard as a DTensor of its group's true length,
    so that a run on another W reads its own new piece from whichever files hold it."""
    mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
    state = {"step": step, "model": run.model.state_dict()}
    state["sampler"] = run.sampler                              # where the data stream is
    state[f"rng/{run.rank}"] = torch.get_rng_state()            # this rank's input noise
    for i, group in enumerate(run.groups):                      # this rank's momentum shards
        numel, n = sum(p.numel() for p in group.params), group.shard_numel
        start, end = min(run.rank * n, numel), min((run.rank + 1) * n, numel)
        buffers = run.optimizer.state[group.shard]
        if "momentum_buffer" not in buffers:                    # a fresh optimizer: load into zeros
            buffers["momentum_buffer"] = torch.zeros_like(group.shard)
        local = buffers["momentum_buffer"][:end - start]        # the padding is not saved
        state[f"momentum/{i}"] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False,
                                                    shape=(numel,), stride=(1,))
    return state


def save_checkpoint(run, directory, step):
    dcp.save(_state(run, step), checkpoint_id=os.path.join(directory, f"step-{step:06d}"))


def load_checkpoint(run, directory):
    whole = [name for name in os.listdir(directory)           # rank 0 writes .metadata last
             if name.startswith("step-") and os.path.exists(os.path.join(directory, name, ".metadata"))]
    if not whole:
        return 0
    path = os.path.join(directory, max(whole))
    saved = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    state = {key: value for key, value in _state(run, 0).items()  # what was saved (a new rank has no rng)
             if any(name == key or name.startswith(key + ".") for name in saved)}
    dcp.load(state, checkpoint_id=path)
    if f"rng/{run.rank}" in state:
        torch.set_rng_state(state[f"rng/{run.rank}"])
    return state["step"]
'''


SOLUTIONS["11"] = '''\
import torch
import torch.distributed as dist


def quantize_blocks(x, block):
    values = x.detach().reshape(-1).to(torch.float32)
    rows = -(-values.numel() // block)
    grid = torch.zeros(rows * block)
    grid[:values.numel()] = values
    grid = grid.view(rows, block)
    scales = grid.abs().amax(dim=1) / 127
    scales = torch.where(scales == 0, torch.ones_like(scales), scales)
    codes = torch.round(grid / scales.unsqueeze(1)).clamp(-127, 127).to(torch.int8)
    return codes.reshape(-1), scales


def dequantize_blocks(codes, scales, numel, block):
    steps = scales.repeat_interleave(block)
    return (codes.to(torch.float32) * steps)[:numel]


def quantized_all_gather(shard, block):
    world, numel = dist.get_world_size(), shard.numel()
    codes, scales = quantize_blocks(shard, block)
    every_codes = [torch.empty_like(codes) for _ in range(world)]
    every_scales = [torch.empty_like(scales) for _ in range(world)]
    dist.all_gather(every_codes, codes)                         # 1 byte per value
    dist.all_gather(every_scales, scales)                       # 4 bytes per block
    return torch.cat([dequantize_blocks(c, s, numel, block) for c, s in zip(every_codes, every_scales)])
'''


def solution(exercise: str) -> str:
    """The reference solution cell of an exercise (by id, stem or notebook name)."""
    return SOLUTIONS[get_exercise(exercise).id]
