"""Block-wise quantisation: a float tensor as small integers, one float32 scale per block of ``block`` values.

ZeRO++ sends weights this way (qwZ, int8) and gradients too (qgZ, int4); streaming DiLoCo sends its outer
gradients in 4 bits. One scale for a whole tensor would let one large value coarsen every other: a block of
values keeps the scale local, so an outlier costs precision only to its own block (Wang et al., "ZeRO++", 2023,
on its block-based quantisation of weights, whose CUDA quantiser aims at blocks of a few thousand; the course's
256 is its own choice, for tensors as small as its MLP's; Dettmers et al., "8-bit Optimizers via Block-wise
Quantization", 2022). Symmetric; lesson 06's int8 (``compressed.py``) is this encoding in 8 bits::

    block = [0.30, -1.20, 0.05, 0.90]          scale s = max|x| / 127 = 1.20 / 127
    codes = round(x / s) = [32, -127, 5, 95]    int8 on the wire: 4 bytes, plus the 4-byte scale
    back  = codes x s = [0.302, -1.200, 0.047, 0.898]   |x - back| <= s / 2 in every element

With ``bits=4`` the codes run from -7 to 7 and two of them share one byte (``pack4``): an eighth of float32's
bytes, plus the scales. The bound is the same, half a step, with a step 18 times as coarse. A tensor's length
need not be a multiple of the block: the last block is padded with zeros, which are never sent back as values.
"""
from __future__ import annotations

import torch

from .. import validate

LEVELS = {8: 127, 4: 7}  # the largest code of each width; symmetric, so -LEVELS..LEVELS


def quantize_blocks(values: torch.Tensor, block: int = 256, bits: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """``values`` (any shape) -> (codes, scales): int8 codes (``bits=8``) or two 4-bit codes per uint8 byte
    (``bits=4``), and one float32 scale per block. An all-zero block gets scale 1: any scale encodes zeros."""
    validate.integer("block", block, low=2)
    validate.choice("bits", bits, tuple(LEVELS))
    if bits == 4 and block % 2:
        raise validate.refusal("block", block, "with bits=4 two codes share a byte: give an even block")
    flat = values.detach().reshape(-1).to(torch.float32)
    blocks = -(-flat.numel() // block)
    padded = torch.zeros(blocks * block, dtype=torch.float32, device=flat.device)
    padded[:flat.numel()] = flat
    rows = padded.view(blocks, block)
    top = LEVELS[bits]
    scales = rows.abs().amax(dim=1) / top
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    codes = torch.round(rows / scales[:, None]).clamp_(-top, top).to(torch.int8).reshape(-1)
    return (codes if bits == 8 else pack4(codes)), scales


def dequantize_blocks(codes: torch.Tensor, scales: torch.Tensor, numel: int, block: int = 256,
                      bits: int = 8) -> torch.Tensor:
    """The float32 values ``numel`` long that ``quantize_blocks`` encoded as ``codes`` and ``scales``."""
    ints = codes if bits == 8 else unpack4(codes)
    rows = ints.to(torch.float32).view(-1, block) * scales[:, None]
    return rows.reshape(-1)[:numel]


def pack4(codes: torch.Tensor) -> torch.Tensor:
    """int8 codes in -7..7 (an even count) -> uint8 bytes, two codes each: low nibble first, offset by 8."""
    shifted = (codes.to(torch.int16) + 8).to(torch.uint8).view(-1, 2)
    return shifted[:, 0] | (shifted[:, 1] << 4)


def unpack4(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack4`."""
    low, high = packed & 0x0F, packed >> 4
    return torch.stack([low, high], dim=1).reshape(-1).to(torch.int16).sub(8).to(torch.int8)


def encoded_bytes(numel: int, block: int = 256, bits: int = 8) -> int:
    """Bytes of codes and scales for ``numel`` values: what one rank's quantised piece weighs on the wire."""
    blocks = -(-numel // block)
    return blocks * block * bits // 8 + blocks * 4


def error_bound(scales: torch.Tensor, block: int, numel: int) -> torch.Tensor:
    """Per element, the most that rounding may move it: half of its block's step."""
    return (scales / 2).repeat_interleave(block)[:numel]
