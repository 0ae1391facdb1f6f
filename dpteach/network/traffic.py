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


def _ask_socket(fd: int, question):
    """``question(sock)`` on a duplicate of socket ``fd`` (the original stays open); None where ``fd`` cannot be
    opened as a socket or the socket cannot answer (not TCP, not connected, no TCP_INFO here)."""
    try:
        copy = _dup(fd)
    except OSError:
        return None
    try:
        sock = socket.socket(fileno=copy)
    except OSError:
        _close(copy)
        return None
    with sock:
        try:
            return question(sock)
        except (OSError, AttributeError):
            return None


def _bytes_received(fd: int, target: str) -> int:
    """What the kernel counted as received on socket ``fd`` - if it is still the socket ``target`` names."""
    try:
        if _readlink(f"/proc/self/fd/{fd}") != target:
            return 0
    except OSError:
        return 0
    info = _ask_socket(fd, lambda sock: sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256))
    return _unpack_from("Q", info, TCP_INFO_BYTES_RECEIVED)[0] if info is not None and len(info) >= 136 else 0


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


def _endpoints(fd: int) -> tuple | None:
    """(this end's address, the other end's) of socket ``fd``; None for a socket that is not connected TCP."""
    return _ask_socket(fd, lambda sock: (tuple(sock.getsockname()[:2]), tuple(sock.getpeername()[:2])))


def peers_of(traffic: Traffic, group=None) -> dict:
    """Which rank is at the other end of each of ``traffic``'s sockets: ``{fd: global rank}``.

    A socket's two ends name each other: this rank's (local, remote) address pair is the other rank's (remote,
    local). Every rank of ``group`` lists its pairs and the ranks swap the lists (``all_gather_object``, once,
    while the strategy is being built): a pair found reversed in rank j's list is a socket to rank j. With that,
    bytes received can be split by who sent them - inside a node or from another one - whatever algorithm gloo
    chose for a collective. Collective: every rank of ``group`` calls it."""
    import torch.distributed as dist
    mine = {}
    for fd, _ in traffic._sockets:
        ends = _endpoints(fd)
        if ends is not None:
            mine[fd] = ends
    lists = [None] * dist.get_world_size(group)
    dist.all_gather_object(lists, (dist.get_rank(), list(mine.items())), group=group)
    owner = {(local, remote): rank for rank, pairs in lists for _, (local, remote) in pairs}
    return {fd: owner[(remote, local)] for fd, (local, remote) in mine.items() if (remote, local) in owner}


def received_from(traffic: Traffic, peers: dict, ranks) -> int | None:
    """Bytes received so far on ``traffic``'s sockets whose other end is one of ``ranks`` (``peers``: from
    :func:`peers_of`); None where this machine cannot count."""
    if not traffic.counts:
        return None
    ranks = set(ranks)
    return sum(_bytes_received(fd, target) for fd, target in traffic._sockets if peers.get(fd) in ranks)
