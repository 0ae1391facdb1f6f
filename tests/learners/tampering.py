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
