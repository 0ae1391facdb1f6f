"""What really reaches a process: the kernel's count of the bytes received on the sockets gloo opened for one
process group.

The course's ``Comm`` accounts for what a strategy *asks* to send (``network/comm.py``), and the grader's
guard for what a learner's code asks (``grading/guard.py``); this counts what arrives, from
``getsockopt(TCP_INFO)`` on the group's own sockets: nothing a program could say about itself. HSDP reads it to
split a step's bytes between the two levels of a network (``sync/hsdp.py``); the grader, to see whether a
rank's data travelled through the process group at all - data exchanged through files, the store or sockets of
the learner's own is not in it.

**Whether counting works is decided once, by the parent, before any rank starts** (:func:`countable`: Linux,
``/proc``, ``TCP_INFO``), and written into the plan the ranks and the judge receive. Where it works, a count
that comes back missing is a count of zero - a learner who empties the socket list, or a gloo that opened
no socket, earns nothing by it; only where the platform cannot count at all does "cannot count" pass
(``grading/checks/common.require_received``).
"""
from __future__ import annotations

import os
import socket
import struct
import sys

TCP_INFO_BYTES_RECEIVED = 128  # offset of tcpi_bytes_received in Linux's struct tcp_info (since 4.1)
# Taken when the grader is imported, before any learner code (the seal watches these modules, too).
_listdir, _readlink, _dup, _close, _unpack_from = os.listdir, os.readlink, os.dup, os.close, struct.unpack_from


def countable() -> bool:
    """Can this machine count the bytes a socket received (the parent asks, once per launch)?"""
    return sys.platform.startswith("linux") and hasattr(socket, "TCP_INFO") and os.path.isdir("/proc/self/fd")


def _sockets() -> set:
    """(fd, inode) of this process's sockets; empty where /proc is missing (not Linux)."""
    found = set()
    try:
        names = _listdir("/proc/self/fd")
    except OSError:
        return found
    for name in names:
        try:
            target = _readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:"):
            found.add((int(name), target))
    return found


def _bytes_received(fd: int, target: str) -> int:
    """What the kernel counted as received on socket ``fd`` - if it is still the socket ``target`` names."""
    try:
        if _readlink(f"/proc/self/fd/{fd}") != target:
            return 0
        copy = _dup(fd)
    except OSError:
        return 0
    try:
        sock = socket.socket(fileno=copy)
    except OSError:
        _close(copy)
        return 0
    with sock:
        try:
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
        except (OSError, AttributeError):  # not a TCP socket, or no TCP_INFO here
            return 0
    return _unpack_from("Q", info, TCP_INFO_BYTES_RECEIVED)[0] if len(info) >= 136 else 0


class Traffic:
    """The bytes that really reached this rank through one check's process group: the kernel's count on
    the sockets gloo opened for it (they are the ones that appear while the group is created).

    ``counts``: the parent's decision (:func:`countable`); None asks this process (tests)."""

    __slots__ = ("counts", "_before", "_sockets")

    def __init__(self, counts: bool | None = None):
        self.counts = countable() if counts is None else bool(counts)
        self._before, self._sockets = frozenset(), ()

    def before_world(self) -> None:
        self._before = frozenset(_sockets())

    def world_started(self) -> None:
        self._sockets = tuple(sorted(_sockets() - self._before))

    def received(self):
        """Bytes received so far on the group's sockets; None only where this machine cannot count them."""
        if not self.counts:
            return None
        return sum(_bytes_received(fd, target) for fd, target in self._sockets)
