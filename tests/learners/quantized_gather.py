"""Exercise 11 (block-quantised all-gather) against learners it has never seen.

``STYLES``: correct solutions that move their int8 codes and scales in other ways than the reference's two
``dist.all_gather`` calls - one packed byte tensor, one broadcast per rank, a hand-made ring of isend/irecv,
the course's own ``ring_all_gather``. Each must score full marks: the byte ceiling of every all-gather check
leaves room for the headers of a few collectives, not for float32 values.

``CHEATS``: held-out solutions that claim what they do not do, each written to pass the checks a first
grader would have had (values within half a step, the right shapes). ``red_team.py`` lists them among its
cases; each must score no more than the untouched stub:

* float32 on the wire while "int8" is claimed: every value is exact, so only the bytes tell;
* the scales never sent: every piece decoded with this rank's own scales, or with a scale of 1;
* one scale for the whole tensor, repeated per block so that the shapes are right: within its own half
  step, but not within each block's - which the checks hold it to, with an outlier in every shard.

The cheats that concern the all-gather leave ``quantize_blocks`` and ``dequantize_blocks`` as the stub has
them: whatever the all-gather checks give them is all they can score.
"""

_QUANTISER = '''\
import torch
import torch.distributed as dist


def quantize_blocks(x, block):
    values = x.detach().reshape(-1).float()
    count = -(-values.numel() // block)
    grid = torch.nn.functional.pad(values, (0, count * block - values.numel())).view(count, block)
    scales = grid.abs().amax(dim=1) / 127
    scales[scales == 0] = 1.0
    return torch.round(grid / scales[:, None]).clamp(-127, 127).to(torch.int8).reshape(-1), scales


def dequantize_blocks(codes, scales, numel, block):
    return (codes.float().view(-1, block) * scales[:, None]).reshape(-1)[:numel]

'''

_STUBS = '''\
import torch
import torch.distributed as dist


def quantize_blocks(x, block):
    raise NotImplementedError("your code here")


def dequantize_blocks(codes, scales, numel, block):
    raise NotImplementedError("your code here")

'''

_GATHERS = {
    "one packed byte tensor": '''
def quantized_all_gather(shard, block):
    world, numel = dist.get_world_size(), shard.numel()
    codes, scales = quantize_blocks(shard, block)
    packed = torch.cat([codes, scales.view(torch.int8)])          # the scales' bytes after the codes
    out = torch.empty(world * packed.numel(), dtype=torch.int8)
    dist.all_gather_into_tensor(out, packed)
    pieces = []
    for row in out.view(world, -1):
        pieces.append(dequantize_blocks(row[:codes.numel()], row[codes.numel():].view(torch.float32), numel, block))
    return torch.cat(pieces)
''',
    "a broadcast per rank": '''
def quantized_all_gather(shard, block):
    world, numel = dist.get_world_size(), shard.numel()
    codes, scales = quantize_blocks(shard, block)
    pieces = []
    for owner in range(world):
        c = codes.clone() if owner == dist.get_rank() else torch.empty_like(codes)
        s = scales.clone() if owner == dist.get_rank() else torch.empty_like(scales)
        dist.broadcast(c, owner)
        dist.broadcast(s, owner)
        pieces.append(dequantize_blocks(c, s, numel, block))
    return torch.cat(pieces)
''',
    "a ring of isend and irecv": '''
def quantized_all_gather(shard, block):
    world, rank, numel = dist.get_world_size(), dist.get_rank(), shard.numel()
    codes, scales = quantize_blocks(shard, block)
    held = {rank: (codes, scales)}
    right, left = (rank + 1) % world, (rank - 1) % world
    for step in range(world - 1):
        out_c, out_s = held[(rank - step) % world]
        in_c, in_s = torch.empty_like(codes), torch.empty_like(scales)
        waits = [dist.irecv(in_c, left), dist.irecv(in_s, left), dist.isend(out_c, right), dist.isend(out_s, right)]
        for work in waits:
            work.wait()
        held[(rank - step - 1) % world] = (in_c, in_s)
    return torch.cat([dequantize_blocks(*held[r], numel, block) for r in range(world)])
''',
    "the course's ring_all_gather": '''
from dpteach.collectives import ring_all_gather


def quantized_all_gather(shard, block):
    world, numel = dist.get_world_size(), shard.numel()
    codes, scales = quantize_blocks(shard, block)
    all_codes = ring_all_gather(codes).view(world, -1)            # the sizes first, then the ring
    all_scales = ring_all_gather(scales).view(world, -1)
    return torch.cat([dequantize_blocks(c, s, numel, block) for c, s in zip(all_codes, all_scales)])
''',
}

STYLES = {name: _QUANTISER + body for name, body in _GATHERS.items()}

# (a) float32 on the wire, int8 in the docstring
FLOAT32_CLAIMED = _STUBS + '''
def quantized_all_gather(shard, block):
    """int8 codes with a float32 scale per block, as ZeRO++ sends them."""  # it does not: float32 goes out
    world = dist.get_world_size()
    pieces = [torch.empty_like(shard) for _ in range(world)]
    dist.all_gather(pieces, shard.contiguous())
    return torch.cat(pieces)                       # exact: well within half a step
'''

_CODES_ONLY = _STUBS + '''
def _encode(x, block):
    grid = torch.nn.functional.pad(x.float(), (0, -x.numel() % block)).view(-1, block)
    scales = grid.abs().amax(dim=1).clamp_min(1e-30) / 127
    return torch.round(grid / scales[:, None]).to(torch.int8), scales


def quantized_all_gather(shard, block):
    """Only the codes travel: a quarter of the bytes, and the scales "are about the same everywhere"."""
    world, numel = dist.get_world_size(), shard.numel()
    codes, scales = _encode(shard, block)
    every = [torch.empty_like(codes) for _ in range(world)]
    dist.all_gather(every, codes)
    return torch.cat([(c.float() * SCALE(scales)).reshape(-1)[:numel] for c in every])
'''

# (b) the scales never sent: every piece decoded with this rank's own scales, or with 1
OWN_SCALES = _CODES_ONLY.replace("SCALE(scales)", "scales[:, None]")
SCALE_ONE = _CODES_ONLY.replace("SCALE(scales)", "1.0")

# (c) one scale for the whole tensor, repeated per block
ONE_SCALE = _QUANTISER.replace("scales = grid.abs().amax(dim=1) / 127",
                               "scales = (grid.abs().amax() / 127).repeat(count)  # one for all: simpler") + '''
def quantized_all_gather(shard, block):
    world, numel = dist.get_world_size(), shard.numel()
    codes, scales = quantize_blocks(shard, block)
    every_codes = [torch.empty_like(codes) for _ in range(world)]
    every_scales = [torch.empty_like(scales) for _ in range(world)]
    dist.all_gather(every_codes, codes)
    dist.all_gather(every_scales, scales)
    return torch.cat([dequantize_blocks(c, s, numel, block) for c, s in zip(every_codes, every_scales)])
'''

CHEATS = {
    "H7 float32 all-gathered, int8 claimed (11)": ("11", FLOAT32_CLAIMED),
    "H8 the scales never sent, own scales used (11)": ("11", OWN_SCALES),
    "H8 the scales never sent, scale 1 used (11)": ("11", SCALE_ONE),
    "H9 one scale for the whole tensor, repeated per block (11)": ("11", ONE_SCALE),
}
