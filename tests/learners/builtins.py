"""Solutions to exercises 01 and 02 that call torch's newest collectives instead of building the ring:
``dist.reduce_scatter_single`` and ``dist.all_gather_single`` (torch 2.13), and the ProcessGroup methods
of the same names. They compute the right answer; each must score zero, as a forbidden call."""

HEADER = "import torch\nimport torch.distributed as dist\nfrom dpteach.collectives import chunk_bounds\n\n"

# Equal chunks for the built-ins: pad to W * ceil(N / W), then cut back to chunk_bounds.
PADDED_01 = HEADER + '''
def _padded(tensor, world):
    flat = tensor.detach().reshape(-1)
    size = -(-flat.numel() // world)
    out = torch.zeros(size * world, dtype=flat.dtype)
    out[:flat.numel()] = flat
    return out, size


def reduce_scatter(tensor):
    world, rank = dist.get_world_size(), dist.get_rank()
    flat, size = _padded(tensor, world)
    out = torch.empty(size, dtype=flat.dtype)
    REDUCE_SCATTER
    start, stop = chunk_bounds(tensor.numel(), world)[rank]
    return out[:stop - start].clone()


def all_gather(chunk, numel):
    world, rank = dist.get_world_size(), dist.get_rank()
    bounds = chunk_bounds(numel, world)
    size = max(b - a for a, b in bounds)
    mine = torch.zeros(size, dtype=chunk.dtype)
    mine[:chunk.numel()] = chunk.reshape(-1)
    gathered = torch.empty(size * world, dtype=chunk.dtype)
    ALL_GATHER
    return torch.cat([gathered[r * size:r * size + (b - a)] for r, (a, b) in enumerate(bounds)])
'''

CALLS = {  # name -> (reduce-scatter call, all-gather call, the forbidden name the report must give)
    "dist.*_single": ("dist.reduce_scatter_single(out, flat)", "dist.all_gather_single(gathered, mine)",
                      "torch.distributed.reduce_scatter_single"),
    "hidden from reading": ("getattr(dist, 'reduce_scatter' + '_single')(out, flat)",
                            "getattr(dist, 'all_gather' + '_single')(gathered, mine)",
                            "torch.distributed.reduce_scatter_single"),
    "ProcessGroup methods": (
        "dist.group.WORLD.reduce_scatter_single(out, flat).wait()",
        "dist.group.WORLD.all_gather_single(gathered, mine).wait()",
        "ProcessGroup.reduce_scatter_single"),
}


def solution(name: str) -> str:
    scatter, gather, _ = CALLS[name]
    return PADDED_01.replace("REDUCE_SCATTER", scatter).replace("ALL_GATHER", gather)


# Exercise 02: the all-reduce as a reduce-scatter and an all-gather, both built in.
RING_02 = HEADER + '''
def ring_all_reduce(tensor):
    world = dist.get_world_size()
    flat = tensor.detach().reshape(-1)
    size = -(-flat.numel() // world)
    padded = torch.zeros(size * world, dtype=flat.dtype)
    padded[:flat.numel()] = flat
    mine = torch.empty(size, dtype=flat.dtype)
    dist.reduce_scatter_single(mine, padded)
    dist.all_gather_single(padded, mine)
    tensor.copy_(padded[:flat.numel()].view(tensor.shape))
    return tensor
'''
