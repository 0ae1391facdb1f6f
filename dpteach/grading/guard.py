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
  function shipped to the rank by reference) still runs the original code object, and the profiler
  sees that code object being entered. The same profiler counts the elements each rank sends with
  ``send``/``isend`` (that is how a check tells a ring from a gather-to-root) and lets checks watch
  other calls, e.g. *when* ``all_reduce`` is launched in the overlap exercise.

The wrappers are installed before the learner's code is loaded in the rank, so a
``from torch.distributed import all_reduce`` in a solution cell binds the wrapper, not the original.

The same profiler notices the learner's code calling the grader's own code - a check module's helper
that computes expected values, its reference answer: whenever the grader's code is entered and the first
frame below it that belongs neither to the standard library nor to another library is the learner's,
that is tampering (``tampering.py`` keeps the note), unless the check handed that function over on
purpose (``hand``: a hook DDP calls, a ``compute_gradient`` the learner's ``work`` calls).

What the counter of sent elements counts is what the learner's code *asks* to send. What really arrives
is counted by :class:`Traffic`: the kernel's own count of the bytes received on the sockets gloo opened
for the check's process group - data exchanged through files, the store or sockets of the learner's own
is not in it.
"""
from __future__ import annotations

import importlib
import inspect
import os
import socket
import struct
import sys
from contextlib import contextmanager

import torch
import torch.distributed as dist

from . import tampering


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

    def __init__(self, forbidden=(), methods=()):
        self.forbidden = tuple(forbidden)
        self.methods = tuple(methods)
        self.calls: list[str] = []       # forbidden calls seen, in order ("torch.distributed.all_reduce")
        self.sent_elements = 0           # elements sent point-to-point while active
        self._sending = 0                # depth of send calls in progress (send calls isend: count once)
        self.active = False
        self._paused = 0
        self._codes: dict = {}           # code object -> forbidden name
        self._watch: dict = {}           # code object -> callback(event, frame, arg)
        self._c_calls: list = []         # callback(event, builtin) as the learner's code calls C functions
        self._patched: list = []         # (owner, attribute, original) to undo
        self._handed: set = set()        # code objects of the grader's that the learner's code may call
        self._grading: dict = {}         # code object -> whether it is the grader's (cache)
        self.traffic = Traffic()
        for name in ("isend", "send"):
            code = _code_of(getattr(dist.distributed_c10d, name))
            if code is not None:
                self._watch[code] = self._count_send

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
        return self

    def _replace(self, owner, attribute, original, name) -> None:
        guard = self

        def forbidden(*args, **kwargs):
            if guard.active and not guard._paused:
                guard.calls.append(name)
                raise ForbiddenCall(f"{name} is not allowed in this exercise")
            return original(*args, **kwargs)

        forbidden.__wrapped_original__ = original
        self._handed.add(forbidden.__code__)
        try:
            setattr(owner, attribute, forbidden)
        except (AttributeError, TypeError):
            return
        self._patched.append((owner, attribute, original))

    def uninstall(self) -> None:
        for owner, attribute, original in reversed(self._patched):
            setattr(owner, attribute, original)
        self._patched.clear()

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

    def unwatch(self, function) -> None:
        self._watch.pop(_code_of(function), None)

    def watch_c_calls(self, callback) -> None:
        """Call ``callback(event, builtin)`` when a C function is called ("c_call", e.g. ``work.wait()``) and
        when it returns or raises ("c_return", "c_exception") while active: what runs in between, such as a
        ``.then()`` callback run at once on a future already done, happened inside that call."""
        self._c_calls.append(callback)

    def clear_watches(self) -> None:
        """Forget every watch a check added (the send counter stays)."""
        counters = {code: cb for code, cb in self._watch.items() if cb == self._count_send}
        self._watch, self._c_calls = counters, []

    # -- the window in which the learner's code runs ----------------------------------------------
    @contextmanager
    def watching(self):
        """Active for the duration: forbidden calls raise, sends are counted, watches fire."""
        previous = sys.getprofile()
        self.active = True
        sys.setprofile(self._profile)
        try:
            yield self
        finally:
            sys.setprofile(previous)
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
            for callback in self._c_calls:
                callback(event, arg)
            return
        if event not in ("call", "return"):
            return
        code = frame.f_code
        name = self._codes.get(code)
        if name is not None and event == "call":
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

    def _count_send(self, event, frame, arg) -> None:
        """Count each message once, whatever the call path: ``send`` is built on ``isend`` in this torch
        (and ``batch_isend_irecv`` calls ``isend`` for each ``P2POp``), so only the outermost send of a
        nest counts - a blocking ``send`` is one message, not two."""
        if event == "call":
            if self._sending == 0:
                tensor = frame.f_locals.get("tensor")
                if isinstance(tensor, torch.Tensor):
                    self.sent_elements += tensor.numel()
            self._sending += 1
        elif event == "return":
            self._sending = max(0, self._sending - 1)


TCP_INFO_BYTES_RECEIVED = 128  # offset of tcpi_bytes_received in Linux's struct tcp_info (since 4.1)


def _sockets() -> set:
    """(fd, inode) of this process's sockets; empty where /proc is missing (not Linux)."""
    found = set()
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return found
    for name in names:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:"):
            found.add((int(name), target))
    return found


def _bytes_received(fd: int, target: str) -> int:
    """What the kernel counted as received on socket ``fd`` - if it is still the socket ``target`` names."""
    try:
        if os.readlink(f"/proc/self/fd/{fd}") != target:
            return 0
        copy = os.dup(fd)
    except OSError:
        return 0
    try:
        sock = socket.socket(fileno=copy)
    except OSError:
        os.close(copy)
        return 0
    with sock:
        try:
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
        except (OSError, AttributeError):  # not a TCP socket, or no TCP_INFO here
            return 0
    return struct.unpack_from("Q", info, TCP_INFO_BYTES_RECEIVED)[0] if len(info) >= 136 else 0


class Traffic:
    """The bytes that really reached this rank through one check's process group: the kernel's count on
    the sockets gloo opened for it (they are the ones that appear while the group is created)."""

    def __init__(self):
        self._before, self._sockets = set(), ()

    def before_world(self) -> None:
        self._before = _sockets()

    def world_started(self) -> None:
        self._sockets = tuple(sorted(_sockets() - self._before))

    def received(self):
        """Bytes received so far on the group's sockets; None where they cannot be counted (no TCP_INFO, no
        /proc, or no socket appeared with the group - a gloo that connects lazily, say)."""
        if not hasattr(socket, "TCP_INFO") or not self._sockets:
            return None
        return sum(_bytes_received(fd, target) for fd, target in self._sockets)
