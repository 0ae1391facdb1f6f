"""The run-time half of "build it yourself": inside each rank, catch calls to the collectives an exercise forbids.

Reading the source (``forbidden.py``) misses ``getattr(dist, "all_" + "reduce")``; watching what
actually runs does not. While the learner's code runs (and only then - the grader's own calls are
outside that window or inside :meth:`Guard.allow`), two mechanisms watch:

* **Wrappers.** Every forbidden function is replaced, in every ``torch.distributed`` and ``dpteach``
  module that exports it, by a wrapper that records the call and raises :class:`ForbiddenCall`. Raising
  (rather than quietly recording) keeps a half-forbidden world from hanging: the call never starts.
  ``ForbiddenCall`` derives from ``BaseException`` so an ``except Exception`` in the learner's code does
  not hide it - and it is recorded before it is raised, so even a bare ``except`` cannot.
* **A profiler** (``sys.setprofile``). A reference taken before the wrappers were installed (a
  function shipped to the rank by reference, or the original a wrapper keeps) still runs the original
  code object, and the profiler sees that code object being entered - or, for a C method of the
  ProcessGroup, sees the very builtin being called (``c_call``). The same profiler lets checks watch
  other calls, e.g. *when* ``all_reduce`` is launched in the overlap exercise.

**Counting what is sent** (how a check tells a ring from a gather-to-root) happens at the bottom of every
path a point-to-point message can take: ``ProcessGroup.send`` itself, which ``dist.send``, ``dist.isend``,
``batch_isend_irecv`` and a direct ``dist.group.WORLD.send(...)`` all reach. The class is sealed
(``seal.py``), and calling the original method around the counter is caught by the profiler like any
forbidden call.

**The grader's own calls** of a forbidden collective (a DDP communication hook of the grader's, its own
all-gathers) are told apart by who makes them: a call whose caller is the grader's code is the grader's.
That way a hook handed to DDP needs to hold neither the guard nor the check's context - nothing the
learner's code can reach from the hook leads back to them.

The wrappers are installed before the learner's code is loaded in the rank, so a
``from torch.distributed import all_reduce`` in a solution cell binds the wrapper, not the original.

The same profiler notices the learner's code calling the grader's own code - a check module's helper
that computes expected values, its reference answer: whenever the grader's code is entered and the first
frame below it that belongs neither to the standard library nor to another library is the learner's,
that is tampering (``tampering.py`` keeps the note), unless the check handed that function over on
purpose (``hand``: a hook DDP calls, a ``compute_gradient`` the learner's ``work`` calls).

What the counter of sent elements counts is what the learner's code *asks* to send. What really arrives
is counted by :class:`~dpteach.network.traffic.Traffic` (``dpteach/network/traffic.py``): the kernel's own count of the
bytes received on the sockets gloo opened for the check's process group.
"""
from __future__ import annotations

import importlib
import inspect
import os
import sys
import threading
from contextlib import contextmanager

import torch
import torch.distributed as dist

from . import tampering
from ..network.traffic import Traffic

_getframe = sys._getframe
_STORE = torch._C._distributed_c10d.Store


class ForbiddenCall(BaseException):
    """The learner's code called a collective that this exercise asks them to build themselves."""


def resolve(qualified: str):
    """The object a dotted name refers to, e.g. ``torch.distributed.all_reduce``; None if absent."""
    module_name, _, attribute = qualified.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError):
        return None


def _code_of(function):
    """The code object a call of ``function`` enters (a class: its ``__init__``), or None for C code."""
    if isinstance(function, type):
        function = function.__dict__.get("__init__")
    try:
        return inspect.unwrap(function).__code__
    except (AttributeError, ValueError, TypeError):
        return None


class Guard:
    """Watches one rank's learner code: forbidden calls, elements sent, and calls a check asks about."""

    def __init__(self, forbidden=(), methods=(), counts_traffic: bool | None = None):
        self.forbidden = tuple(forbidden)
        self.methods = tuple(methods)
        self.calls: list[str] = []       # forbidden calls seen, in order ("torch.distributed.all_reduce")
        self.sent_elements = 0           # elements sent point-to-point while active
        self.active = False
        self._paused = 0
        self._codes: dict = {}           # code object -> forbidden name
        self._builtins: dict = {}        # id of a C original -> (it, forbidden name or None: counted send)
        self._watch: dict = {}           # code object -> callback(event, frame, arg)
        self._c_calls: list = []         # callback(event, builtin) as the learner's code calls C functions
        self._handed: set = set()        # code objects of the grader's that the learner's code may call
        self._grading: dict = {}         # code object -> whether it is the grader's (cache)
        self._handed |= {Handed.__call__.__code__, Handed.__getattribute__.__code__, Handed.__setattr__.__code__}
        self.traffic = Traffic(counts_traffic)

    # -- set-up -----------------------------------------------------------------------------------
    def install(self) -> "Guard":
        """Put the wrappers in place (once per rank, before the learner's code is loaded)."""
        targets = {}
        for name in self.forbidden:
            function = resolve(name)
            if function is not None:
                targets[id(function)] = (function, name)
                code = _code_of(function)
                if code is not None:
                    self._codes[code] = name
        for module in [m for n, m in list(sys.modules.items())
                       if m is not None and n.startswith(("torch.distributed", "torch.nn.parallel", "dpteach"))
                       and not n.startswith("dpteach.grading")]:
            for attribute, value in list(vars(module).items()):
                if id(value) in targets and targets[id(value)][0] is value:
                    self._replace(module, attribute, value, targets[id(value)][1])
        group_class = torch._C._distributed_c10d.ProcessGroup
        for method in self.methods:
            if hasattr(group_class, method):
                self._replace(group_class, method, getattr(group_class, method), f"ProcessGroup.{method}")
        self._count_sends(group_class)
        return self

    def _grader_below(self, frame) -> bool:
        """Is the first frame from ``frame`` down that is not a library's or the standard library's the
        grader's (its DDP hook, its all-gather - through torch's own functions)?"""
        below = tampering.first_not(("stdlib", "library"), frame)
        return below is not None and self._is_grading(below.f_code)

    def _count_sends(self, group_class) -> None:
        """Count every point-to-point message where all paths meet: ``ProcessGroup.send``."""
        original, guard = group_class.send, self

        def send(group, tensors, *args, **kwargs):
            if guard.active and not guard._paused:
                guard.sent_elements += sum(t.numel() for t in tensors if isinstance(t, torch.Tensor))
            return original(group, tensors, *args, **kwargs)

        self._handed.add(send.__code__)
        self._builtins[id(original)] = (original, None)
        group_class.send = send

    def _replace(self, owner, attribute, original, name) -> None:
        guard = self

        def forbidden(*args, **kwargs):
            if guard.active and not guard._paused and not guard._grader_below(_getframe(1)):
                guard.calls.append(name)
                raise ForbiddenCall(f"{name} is not allowed in this exercise")
            return original(*args, **kwargs)

        self._handed.add(forbidden.__code__)
        if _code_of(original) is None:  # a C method: called around the wrapper, only the profiler sees it
            self._builtins[id(original)] = (original, name)
        try:
            setattr(owner, attribute, forbidden)
        except (AttributeError, TypeError):
            return

    def watch(self, function, callback) -> None:
        """Call ``callback(event, frame, arg)`` on 'call' and 'return' of ``function`` while active."""
        code = _code_of(function)
        if code is not None:
            self._watch[code] = callback

    def hand(self, function) -> None:
        """Let the learner's code call ``function`` (grader code given to it on purpose)."""
        code = _code_of(function)
        if code is not None:
            self._handed.add(code)

    def watch_c_calls(self, callback) -> None:
        """Call ``callback(event, builtin)`` when a C function is called ("c_call", e.g. ``work.wait()``) and
        when it returns or raises ("c_return", "c_exception") while active: what runs in between, such as a
        ``.then()`` callback run at once on a future already done, happened inside that call."""
        self._c_calls.append(callback)

    def unwatch_c_calls(self, callback) -> None:
        self._c_calls = [c for c in self._c_calls if c is not callback]

    def clear_watches(self) -> None:
        """Forget every watch a check added."""
        self._watch, self._c_calls = {}, []

    # -- the window in which the learner's code runs ----------------------------------------------
    @contextmanager
    def watching(self):
        """Active for the duration: forbidden calls raise, sends are counted, watches fire."""
        previous, for_threads = sys.getprofile(), threading.getprofile()
        self.active = True
        sys.setprofile(self._profile)
        threading.setprofile(self._profile)  # threads the learner's code starts are watched too
        try:
            yield self
        finally:
            sys.setprofile(previous)
            threading.setprofile(for_threads)
            self.active = False

    @contextmanager
    def allow(self):
        """The grader's own calls made while the learner's code is active (e.g. a DDP comm hook)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def _profile(self, frame, event, arg) -> None:
        if self._paused:
            return
        if event in ("c_call", "c_return", "c_exception"):
            known = self._builtins.get(id(arg)) if event == "c_call" else None
            if known is not None and known[0] is arg and not self._grader_below(frame):
                if known[1] is not None:
                    self.calls.append(known[1])
                else:
                    tampering.note("called ProcessGroup.send past the grader's count of what it sends")
            elif known is None and event == "c_call" and isinstance(getattr(arg, "__self__", None), _STORE) \
                    and not self._grader_below(frame):  # the key-value store carries no counted message
                tampering.note("used the process group's key-value store: data must travel as messages")
            for callback in self._c_calls:
                callback(event, arg)
            return
        if event not in ("call", "return"):
            return
        code = frame.f_code
        name = self._codes.get(code)
        if name is not None and event == "call" and not self._grader_below(frame.f_back):
            self.calls.append(name)
        if event == "call" and code not in self._handed and self._is_grading(code):
            below = tampering.first_not(("stdlib", "library"), frame.f_back)
            if below is not None and tampering.kind(below.f_code.co_filename) == "learner":
                tampering.note(f"called the grader's own {code.co_name} ({os.path.basename(code.co_filename)}), "
                               f"which the checks judge with")
        callback = self._watch.get(code)
        if callback is not None:
            callback(event, frame, arg)

    def _is_grading(self, code) -> bool:
        found = self._grading.get(code)
        if found is None:
            found = self._grading[code] = tampering.kind(code.co_filename) == "grading"
        return found


class Handed:
    """A callable of the grader's handed to the learner's code (a DDP hook, a ``compute_gradient``): the
    learner's code may call it, not look inside it. What it wraps holds nothing the checks judge with - no
    context, no counter (the guard counts its calls) - so looking inside would find nothing; it is still
    tampering, and noted (attributes read from the learner's code: ``__closure__``, ``__wrapped__``...)."""

    __slots__ = ("_function",)

    def __init__(self, function):
        object.__setattr__(self, "_function", function)

    def __call__(self, *args, **kwargs):
        return object.__getattribute__(self, "_function")(*args, **kwargs)

    def __getattribute__(self, name):
        function = object.__getattribute__(self, "_function")
        if tampering.learner_below(_getframe(1)):
            tampering.note(f"looked inside {getattr(function, '__name__', 'a function')}, which the grader handed "
                           f"over to be called (.{name})")
        if name == "__signature__":
            return inspect.signature(function)
        return getattr(function, name) if name.startswith("__") and name != "__class__" else \
            object.__getattribute__(self, name)

    def __setattr__(self, name, value):
        raise AttributeError(f"{name}: the grader's callable cannot be changed")
