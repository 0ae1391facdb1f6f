"""Solutions to exercise 02 that end their own process in the middle of the ring, on rank 1 only."""

_RING_WITH = '''
import os
import signal
import torch
import torch.distributed as dist
from dpteach.collectives import chunk_bounds, exchange


def ring_all_reduce(tensor):
    world, rank = dist.get_world_size(), dist.get_rank()
    if world > 1 and rank == 1:
        {how}
    buf = tensor.detach().reshape(-1).clone()
    bounds = chunk_bounds(buf.numel(), world)
    inbox = torch.empty(max(b - a for a, b in bounds), dtype=buf.dtype)
    for step in range(world - 1):
        s0, s1 = bounds[(rank - step - 1) % world]
        r0, r1 = bounds[(rank - step - 2) % world]
        exchange(buf[s0:s1], (rank + 1) % world, inbox[:r1 - r0], (rank - 1) % world)
        buf[r0:r1] += inbox[:r1 - r0]
    for step in range(world - 1):
        s0, s1 = bounds[(rank - step) % world]
        r0, r1 = bounds[(rank - step - 1) % world]
        exchange(buf[s0:s1], (rank + 1) % world, buf[r0:r1], (rank - 1) % world)
    tensor.copy_(buf.view(tensor.shape))
    return tensor
'''

EXITS = {  # name -> (the statement, what the report must say)
    "os._exit(0)": ("os._exit(0)", "rank 1 ended its own process with exit code 0"),
    "os._exit(3)": ("os._exit(3)", "rank 1 ended its own process with exit code 3"),
    "SIGKILL": ("os.kill(os.getpid(), signal.SIGKILL)", "rank 1 was killed by SIGKILL"),
    "native crash": ("import ctypes; ctypes.string_at(0)", "rank 1 was killed by SIGSEGV (a crash in native code"),
}


def solution(name: str) -> str:
    return _RING_WITH.format(how=EXITS[name][0]).lstrip()
