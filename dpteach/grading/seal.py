"""Notice when a solution rewires what the checks judge with, before the check judges.

A check compares what the learner's code produced with what it should be, using torch, numpy, Python's
builtins and the grader's own modules; the rank records what happened (``learner.py``) for the replay
outside the ranks (``replay.py``). Learner code runs in the same process, so it could replace any of those
- ``torch.equal = lambda a, b: True``, a helper of the exercise's check module, the recording's encoder -
or leave torch itself judging differently: a ``TorchFunctionMode`` or ``TorchDispatchMode`` left on the
stack, a method added to ``torch.Tensor`` that shadows the C one below it, a kernel registered over
``aten::equal``, a trace function or a thread of its own still running.

The seal takes a picture of all of that just before the learner's code is loaded, and compares at every
*checkpoint*: each time a call into the learner's code returns (before anything it returned is judged or
recorded) and once more before a check's verdict is written. What it pictures:

* **libraries** (torch, numpy, builtins, os, json...): which object every public callable is;
* **the grader's modules** - every module of ``dpteach.grading``, each exercise's check module included -
  and the classes defined there, ``torch.Tensor``, its metaclass and ``Parameter``, and the process
  group's classes (``ProcessGroup``, ``Work``, the gloo backend, the stores): every name, callable or not,
  and no name added or removed;
* **code** of what the replay takes on trust: the rank's machinery (this module, ``in_rank``, ``learner``,
  ``replay``, ``guard``, ``tampering``, ``spec``) and every function marked ``spec.observes`` - its code
  object, defaults and closure. A helper that only computes what is expected is judged again in the
  replay, where the learner's code never ran; swapping its code is caught there;
* **dispatch and process state**: torch's mode stacks and infra modes, whether torch functions dispatch at
  all, the thread-local dispatch key sets, the kernels of the operators the checks use, trace and profile
  functions, and the number of Python threads.

torch's own lazy wrappers are told apart from a learner's replacement by where their code lives
(:func:`_torch_wrapped`). A broken seal scores the attempt 0 and the report names what was replaced.
"""
from __future__ import annotations

import _thread
import builtins
import importlib
import inspect
import math
import operator
import os
import sys
import threading
import types

import torch

from .spec import OBSERVERS

MODULES = ("torch", "torch.distributed", "torch.distributed.distributed_c10d", "torch.nn.functional",
           "torch.testing", "torch.linalg", "torch.overrides", "numpy", "numpy.testing", "dpteach",
           "dpteach.collectives", "dpteach.collectives._p2p", "os", "gc", "json", "base64", "struct",
           "ctypes", "socket", "secrets", "hmac", "hashlib", "threading", "_thread", "functools", "random",
           "tempfile")
STRICT_PREFIX = "dpteach.grading"
TRUSTED_MODULES = ("dpteach.grading.seal", "dpteach.grading.in_rank", "dpteach.grading.learner",
                   "dpteach.grading.replay", "dpteach.grading.guard", "dpteach.grading.tampering",
                   "dpteach.grading.spec", "dpteach.grading.salts", "dpteach.network.traffic",
                   "dpteach.grading.watchdog")
_c10d = torch._C._distributed_c10d
# The process group's classes too: the grader's own all-gathers and the guard's send counter go through
# them (a learner's ``ProcessGroup.allgather = fake`` would otherwise answer the grader).
CLASSES = (torch.Tensor, type(torch.Tensor), torch.nn.Parameter, torch._C.TensorBase) + tuple(
    getattr(_c10d, name) for name in ("ProcessGroup", "Work", "Backend", "ProcessGroupGloo", "Store", "TCPStore",
                                      "PrefixStore", "GradBucket") if hasattr(_c10d, name))
OPERATORS = ("aten::equal", "aten::eq.Tensor", "aten::ne.Tensor", "aten::allclose", "aten::isclose", "aten::abs",
             "aten::sum", "aten::add.Tensor", "aten::sub.Tensor", "aten::mul.Tensor", "aten::div.Tensor",
             "aten::cat", "aten::stack", "aten::clone", "aten::copy_", "aten::detach", "aten::view", "aten::_to_copy",
             "aten::any", "aten::all", "aten::gt.Tensor", "aten::count_nonzero", "aten::sort", "aten::max")
IGNORED = {"__warningregistry__", "__slotnames__"}  # written by warnings and by copyreg (pickling), not by code
TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def _module(name):
    module = sys.modules.get(name)
    if module is None:
        try:
            module = importlib.import_module(name)
        except ImportError:
            return None
    return module


def _library_callables() -> list:
    """(namespace, its name, attribute, object) for every public callable of the libraries the checks use."""
    found = {"builtins": vars(builtins), "math": vars(math), "operator": vars(operator)}
    found.update({name: vars(m) for name in MODULES if (m := _module(name)) is not None})
    return [(members, space, attribute, value) for space, members in found.items()
            for attribute, value in list(members.items())
            if callable(value) and not isinstance(value, types.ModuleType)]


def _strict_spaces() -> dict:
    """The grader's module namespaces and every class whose names must stay exactly as they are."""
    spaces = {}
    for name, module in list(sys.modules.items()):
        if module is not None and (name == STRICT_PREFIX or name.startswith(STRICT_PREFIX + ".")):
            spaces[name] = vars(module)
            for value in list(vars(module).values()):
                if inspect.isclass(value) and getattr(value, "__module__", "").startswith(STRICT_PREFIX):
                    spaces.setdefault(f"{value.__module__}.{value.__qualname__}", vars(value))
    for cls in CLASSES:
        spaces[f"{cls.__module__}.{cls.__qualname__}"] = vars(cls)
    return spaces


def _picture(space) -> dict:
    return {key: value for key, value in list(space.items())
            if key not in IGNORED and not isinstance(value, types.ModuleType)}


def _functions(modules) -> dict:
    """Every function defined in the named modules, and in the classes they define, by qualified name."""
    found = {}
    for name in modules:
        module = _module(name)
        for attribute, value in list(vars(module).items()):
            members = vars(value).items() if inspect.isclass(value) and value.__module__ == name else [("", value)]
            for member, function in members:
                function = getattr(function, "__func__", function)  # staticmethod / classmethod
                if isinstance(function, types.FunctionType) and function.__module__ == name:
                    found[f"{name.rpartition('.')[2]}.{attribute}{'.' + member if member else ''}"] = function
    return found


def _trusted_functions() -> dict:
    observers = {f"{f.__module__.rpartition('.')[2]}.{f.__qualname__}": f for f in OBSERVERS}
    return {**_functions(TRUSTED_MODULES), **observers}


def _grading_functions() -> dict:
    return _functions([name for name, module in list(sys.modules.items()) if module is not None
                       and (name == STRICT_PREFIX or name.startswith(STRICT_PREFIX + "."))])


def _fingerprint(function) -> tuple:
    """What a call of ``function`` runs: its code, defaults and closure, as the objects themselves."""
    cells = []
    for cell in function.__closure__ or ():
        try:
            cells.append(cell.cell_contents)
        except ValueError:  # a cell not filled yet
            cells.append(cell)
    kwdefaults = tuple((function.__kwdefaults__ or {}).items())
    return (function.__code__, function.__defaults__, *(value for _, value in kwdefaults), *cells)


def _same(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


# Taken when the grader is imported, before any learner code: a replaced torch._C.* or sys.* cannot hide a mode.
_C = torch._C
_STATE_READERS = (_C._len_torch_function_stack, _C._len_torch_dispatch_stack, _C._is_torch_function_enabled,
                  _C._dispatch_tls_local_include_set, _C._dispatch_tls_local_exclude_set, _C._get_dispatch_mode,
                  sys.gettrace, sys.getprofile, threading.gettrace, threading.getprofile, _thread._count)
_MODE_KEYS = tuple(_C._TorchDispatchModeKey.__members__.values())


def dispatch_state() -> dict:
    """What decides how a torch call is dispatched, beyond the functions themselves; and who else runs."""
    (functions, dispatches, enabled, included, excluded, infra, gettrace, getprofile, thread_trace, thread_profile,
     threads) = _STATE_READERS
    state = {"torch function modes": functions(), "torch dispatch modes": dispatches(),
             "torch function dispatch": enabled(), "included dispatch keys": str(included()),
             "excluded dispatch keys": str(excluded())}
    for key in _MODE_KEYS:
        state[f"infra mode {key.name}"] = infra(key) is not None
    state.update({"trace function": gettrace(), "profile function": getprofile(),
                  "thread trace function": thread_trace(), "thread profile function": thread_profile(),
                  "Python threads": threads()})
    return state


def _mode_names() -> str:
    C = torch._C
    names = [type(C._get_function_stack_at(i)).__name__ for i in range(C._len_torch_function_stack())]
    names += [type(C._get_dispatch_stack_at(i)).__name__ for i in range(C._len_torch_dispatch_stack())]
    return ", ".join(names) or "none"


def _kernels() -> dict:
    found = {}
    for name in OPERATORS:
        try:
            found[name] = torch._C._dispatch_dump_table(name)
        except RuntimeError:
            pass
    return found


TORCH_STATE = {"torch function modes", "torch dispatch modes", "torch function dispatch", "included dispatch keys",
               "excluded dispatch keys"}


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
    """A picture of the checks' tools, taken once; :meth:`broken` and :meth:`problems` compare with it."""

    def __init__(self):
        self._callables = _library_callables()
        self._spaces = {name: (space, _picture(space)) for name, space in _strict_spaces().items()}
        self._functions = {name: (f, _fingerprint(f)) for name, f in _trusted_functions().items()}
        self._state = dispatch_state()
        self._kernels = _kernels()
        self._code = {name: (f, f.__code__) for name, f in _grading_functions().items()}

    def recount_threads(self) -> None:
        """In a child forked for one submission (``watchdog.in_own_process``), before its learner code loads:
        threads do not survive a fork, and the child starts its own watchdog's."""
        self._state["Python threads"] = dispatch_state()["Python threads"]

    def broken(self) -> list[str]:
        """The names whose objects were replaced (or added, or removed, where every name counts)."""
        found = {f"{space}.{attribute}" for members, space, attribute, old in self._callables
                 if (now := members.get(attribute)) is not old and not _torch_wrapped(old, now)}
        for space_name, (space, before) in self._spaces.items():
            after = _picture(space)
            for key in before.keys() | after.keys():
                if before.get(key, before) is not after.get(key, before):
                    how = " (added)" if key not in before else " (removed)" if key not in after else ""
                    found.add(f"{space_name}.{key}{how}")
        found |= {f"the code of {name}" for name, (function, print_) in self._functions.items()
                  if not _same(_fingerprint(function), print_)}
        return sorted(found)

    def changed_code(self) -> list[str]:
        """Functions of the grader whose code is not what it was - for the report only: a helper that only
        computes what is expected is judged again outside the ranks, where its code is the grader's."""
        return sorted(name for name, (function, code) in self._code.items() if function.__code__ is not code)

    def problems(self, final: bool = False) -> list[str]:
        """Everything that changed, as sentences for the report; ``final`` compares operators' kernels too."""
        out = []
        replaced = self.broken()
        if replaced:
            out.append(f"your code replaced {listing(replaced)}, which the checks use to judge it")
        state = dispatch_state()
        changed = [key for key, value in self._state.items() if state[key] != value]
        if any(key in TORCH_STATE or key.startswith("infra mode") for key in changed):
            out.append(f"your code left torch dispatching differently ({listing(changed)}; modes active: "
                       f"{_mode_names()}), so torch's answers in the checks could not be trusted")
        elif changed:
            out.append(f"your code left {listing(changed)} running while the checks judge")
        if final:
            kernels = _kernels()
            overridden = [name for name, table in self._kernels.items() if kernels.get(name) != table]
            if overridden:
                out.append(f"your code registered kernels of its own for {listing(overridden)}")
        return out


def listing(names: list[str], most: int = 4) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")
