"""Correct ring solutions to exercises 01 and 02 in every point-to-point style the exercises allow.

Each style defines ``_swap(send, dst, recv, src)`` - send one chunk to the right neighbour while
receiving one from the left - and the same ring loops then use it. A correct solution in any of these
styles must score full marks: every message is counted once, whatever the call path.
"""

SWAPS = {
    "exchange": '''
def _swap(send, dst, recv, src):
    exchange(send, dst, recv, src)
''',
    "isend_irecv": '''
def _swap(send, dst, recv, src):
    waiting = []
    if recv.numel():
        waiting.append(dist.irecv(recv, src))
    if send.numel():
        waiting.append(dist.isend(send.contiguous(), dst))
    for request in waiting:
        request.wait()
''',
    "send_recv": '''
def _swap(send, dst, recv, src):
    # blocking calls: even ranks send first, odd ranks receive first, so the ring never waits on itself
    first_send = dist.get_rank() % 2 == 0
    for turn in ("send", "recv") if first_send else ("recv", "send"):
        if turn == "send" and send.numel():
            dist.send(send.contiguous(), dst)
        if turn == "recv" and recv.numel():
            dist.recv(recv, src)
''',
    "batch_p2pop": '''
def _swap(send, dst, recv, src):
    ops = []
    if recv.numel():
        ops.append(dist.P2POp(dist.irecv, recv, src))
    if send.numel():
        ops.append(dist.P2POp(dist.isend, send.contiguous(), dst))
    for request in dist.batch_isend_irecv(ops) if ops else []:
        request.wait()
''',
}

HEADER = '''
import torch
import torch.distributed as dist
from dpteach.collectives import chunk_bounds, exchange
'''

RING_01 = '''
def reduce_scatter(tensor):
    world, rank = dist.get_world_size(), dist.get_rank()
    buf = tensor.detach().reshape(-1).clone()
    bounds = chunk_bounds(buf.numel(), world)
    inbox = torch.empty(max(b - a for a, b in bounds), dtype=buf.dtype)
    for step in range(world - 1):
        s0, s1 = bounds[(rank - step - 1) % world]
        r0, r1 = bounds[(rank - step - 2) % world]
        _swap(buf[s0:s1], (rank + 1) % world, inbox[:r1 - r0], (rank - 1) % world)
        buf[r0:r1] += inbox[:r1 - r0]
    start, stop = bounds[rank]
    return buf[start:stop].clone()


def all_gather(chunk, numel):
    world, rank = dist.get_world_size(), dist.get_rank()
    bounds = chunk_bounds(numel, world)
    out = torch.empty(numel, dtype=chunk.dtype)
    start, stop = bounds[rank]
    out[start:stop] = chunk.reshape(-1)
    for step in range(world - 1):
        s0, s1 = bounds[(rank - step) % world]
        r0, r1 = bounds[(rank - step - 1) % world]
        _swap(out[s0:s1], (rank + 1) % world, out[r0:r1], (rank - 1) % world)
    return out
'''

RING_02 = '''
def ring_all_reduce(tensor):
    world, rank = dist.get_world_size(), dist.get_rank()
    buf = tensor.detach().reshape(-1).clone()
    bounds = chunk_bounds(buf.numel(), world)
    inbox = torch.empty(max(b - a for a, b in bounds), dtype=buf.dtype)
    for step in range(world - 1):
        s0, s1 = bounds[(rank - step - 1) % world]
        r0, r1 = bounds[(rank - step - 2) % world]
        _swap(buf[s0:s1], (rank + 1) % world, inbox[:r1 - r0], (rank - 1) % world)
        buf[r0:r1] += inbox[:r1 - r0]
    for step in range(world - 1):
        s0, s1 = bounds[(rank - step) % world]
        r0, r1 = bounds[(rank - step - 1) % world]
        _swap(buf[s0:s1], (rank + 1) % world, buf[r0:r1], (rank - 1) % world)
    tensor.copy_(buf.view(tensor.shape))
    return tensor
'''


def solution(exercise: str, style: str) -> str:
    ring = {"01": RING_01, "02": RING_02}[exercise]
    return (HEADER + SWAPS[style] + ring).lstrip()
