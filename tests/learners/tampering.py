"""Solutions to exercise 02 that do no communication at all and rewire what the checks judge with."""

AT_LOAD = '''
import torch
import torch.testing

torch.equal = lambda a, b: True
torch.allclose = lambda *args, **kwargs: True
torch.Tensor.__eq__ = lambda self, other: torch.ones_like(self, dtype=torch.bool)
torch.testing.assert_close = lambda *args, **kwargs: None


def ring_all_reduce(tensor):
    return tensor
'''

AT_CALL = '''
import builtins
import torch


def ring_all_reduce(tensor):
    builtins.all = lambda iterable: True   # rewired the first time the grader calls it
    torch.equal = lambda a, b: True
    return tensor
'''

TAMPERING = {"at load": (AT_LOAD, "torch.equal"), "at call": (AT_CALL, "builtins.all")}

DISGUISED = '''
import functools
import torch

torch.equal = functools.wraps(torch.equal)(lambda a, b: True)  # claims to wrap the original


def ring_all_reduce(tensor):
    return tensor
'''

TAMPERING["disguised as a wrapper"] = (DISGUISED, "torch.equal")

# Gets past the seal: the function object stays the same one, only its code changes. The grader's own helper
# for the expected sum now returns this rank's data, so returning the input unchanged "matches" in the rank.
# Only the replay outside the ranks (dpteach/grading/replay.py), where this code never ran, sees through it.
CODE_SWAP = '''
from dpteach.grading.checks import common


def _own_data_only(seed, world, numel, dtype, shape=None):
    import torch.distributed as dist
    return rank_data(seed, dist.get_rank(), numel, dtype, shape)


common.sum_over_ranks.__code__ = _own_data_only.__code__


def ring_all_reduce(tensor):
    return tensor
'''
