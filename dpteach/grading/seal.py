"""Notice when a solution rewires the libraries that the checks themselves use.

A check compares what the learner's code produced with what it should be, using torch (``torch.equal``,
``Tensor.__eq__``, ``dist.all_reduce`` for the expected sum), numpy, Python's builtins and dpteach's
own helpers. Learner code runs in the same process, so a solution cell could replace one of those -
``torch.equal = lambda a, b: True`` - and every comparison after it would pass, whatever the code did.

The seal records, just before the learner's code is loaded, which object every public callable of
those modules and classes is. After each check the rank compares again; any callable that now is a
different object was replaced while the learner's code ran (the grader itself replaces nothing once
the seal is taken: the guard's wrappers are installed before it). A broken seal scores the attempt 0
and the report names what was replaced.

Only callables (functions, classes, methods) are compared: module-level numbers and caches change by
themselves as worlds are created, and adding a new name changes no check. torch's own lazy wrappers
are told apart from a learner's replacement by where their code lives (:func:`_torch_wrapped`). A
determined learner could still get past this (``ctypes``, a code object compiled under torch's file
name); it is there to catch the shortcut, and a broken seal is reported, not silently fixed.
"""
from __future__ import annotations

import builtins
import importlib
import math
import operator
import os
import sys

import torch

MODULES = ("torch", "torch.distributed", "torch.distributed.distributed_c10d", "torch.nn.functional",
           "torch.testing", "torch.linalg", "numpy", "numpy.testing", "dpteach", "dpteach.collectives",
           "dpteach.collectives._p2p", "dpteach.grading.spec", "dpteach.grading.checks.common")
CLASSES = (torch.Tensor, torch._C.TensorBase)


def _namespaces() -> dict:
    spaces = {"builtins": vars(builtins), "math": vars(math), "operator": vars(operator)}
    for name in MODULES:
        module = sys.modules.get(name)
        if module is None:
            try:
                module = importlib.import_module(name)
            except ImportError:
                continue
        spaces[name] = vars(module)
    for cls in CLASSES:
        spaces[f"{cls.__module__}.{cls.__qualname__}"] = vars(cls)
    return spaces


def _callables() -> dict:
    found = {}
    for space, members in _namespaces().items():
        for attribute, value in list(members.items()):
            if callable(value) and not isinstance(value, type(sys)):
                found[f"{space}.{attribute}"] = value
    return found


TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def _torch_wrapped(old, new) -> bool:
    """True when torch itself wrapped ``old``: importing ``torch._dynamo`` (which DDP may do lazily) puts
    ``torch._disable_dynamo`` wrappers around some functions, e.g. ``torch.manual_seed``. Such a wrapper
    leads back to the original through ``__wrapped__`` and its code lives in torch's own files; a
    replacement written in a solution cell has its code in the cell, whatever it claims to wrap."""
    code = getattr(new, "__code__", None)
    seen = new
    for _ in range(8):
        seen = getattr(seen, "__wrapped__", None)
        if seen is None:
            return False
        if seen is old:
            return code is not None and code.co_filename.startswith(TORCH_DIR)
    return False


class Seal:
    """Which object each protected callable is, taken once; :meth:`broken` lists those replaced since."""

    def __init__(self):
        self._before = _callables()

    def broken(self) -> list[str]:
        now = _callables()
        return sorted(name for name, old in self._before.items()
                      if now.get(name) is not old and not _torch_wrapped(old, now.get(name)))
