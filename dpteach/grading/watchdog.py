"""A rank's plumbing: its signed results file, the watchdog that keeps time limits, the store barrier, and
running one submission in a process of its own.

See ``in_rank.py`` for why verdicts are signed and how the watchdog ends a rank. What this module adds:

**One process per submission** (:func:`in_own_process`). ``grade_many`` lets several submissions share one
launch (starting ranks is the expensive part of grading). They must not share a process: a submission's
changes to its process - a patched library the seal does not picture, a thread, a cache - would be the
next submission's starting point, and an honest solution graded after a tampering one could score 0 (or
be judged with the tampering's tools). So when a launch holds several jobs, each rank forks once per job,
from the state it had before any learner code was loaded: what one job does dies with its process.
Forking costs milliseconds, not the seconds of a new interpreter importing torch.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import signal
import threading
import time
import traceback
from datetime import timedelta

import torch.distributed as dist

WATCHDOG_EXIT_CODE = 75
PROCESS_GROUP_TIMEOUT = timedelta(seconds=600)  # the watchdog acts long before this
PEER_FAILED_GRACE = 1.0  # seconds a rank may still take to finish a check that failed on a peer
POLL_INTERVAL = 0.1      # how often a watchdog asks the store whether a peer has failed the check


def mac(key: bytes, data: bytes) -> bytes:
    """HMAC-SHA256 of ``data`` under ``key``: how whatever a grading process sends back is signed, so that the
    learner's code, which can write where the grader reads but does not hold the key, cannot forge it."""
    return hmac.new(key, data, hashlib.sha256).digest()


def sign(key: bytes, record: dict) -> str:
    """The MAC of a record (its JSON with sorted keys), in hex: the runner checks it with the same key."""
    return mac(key, json.dumps(record, sort_keys=True).encode()).hex()


class Results:
    """One JSON line per event, appended atomically to this rank's file; signed when given a key."""

    def __init__(self, path: str, rank: int, key: bytes | None = None):
        self.rank, self._key = rank, key
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, **record) -> None:
        record["rank"] = self.rank
        if self._key is not None:
            record["mac"] = sign(self._key, record)
        os.write(self.fd, (json.dumps(record) + "\n").encode())


class Watchdog(threading.Thread):
    """Ends this rank when the armed check runs past its limit, after saying so in the results file - or,
    once a peer has failed the check, when this rank has not finished it ``grace`` seconds later.

    It asks the store through a client of its own: the main thread's client may be blocked in a wait.
    """

    def __init__(self, results: "Results", store=None):
        super().__init__(daemon=True)
        self.results, self.store = results, store
        self.armed = None  # (label, limit, deadline, key a failing peer sets, grace): replaced whole

    def arm(self, label, seconds: float, failed_key: str | None = None, grace: float = PEER_FAILED_GRACE) -> None:
        self.armed = (label, seconds, time.monotonic() + seconds, failed_key, grace)

    def settle(self) -> None:
        """This rank has its verdict: only the time limit still applies (peers may keep it waiting)."""
        armed = self.armed
        if armed is not None:
            self.armed = armed[:3] + (None, armed[4])

    def disarm(self) -> None:
        self.armed = None

    def run(self) -> None:
        seen, stop_at, next_poll = None, None, 0.0
        while True:
            armed, now = self.armed, time.monotonic()
            if armed is not seen:
                seen, stop_at = armed, None
            if armed is not None:
                label, limit, deadline, failed_key, grace = armed
                if now > deadline:
                    self.results.write(event="timeout", check=label, limit=limit, at=time.time())
                    os._exit(WATCHDOG_EXIT_CODE)
                if failed_key is not None and stop_at is None and now >= next_poll and self.store is not None:
                    next_poll = now + POLL_INTERVAL
                    try:
                        if self.store.check([failed_key]):
                            stop_at = now + grace
                    except Exception:  # the store is going away with the world: the time limit still holds
                        pass
                if failed_key is not None and stop_at is not None and now > stop_at:
                    self.results.write(event="stopped", check=label, at=time.time())
                    os._exit(WATCHDOG_EXIT_CODE)
            time.sleep(0.02)


def wait_for_peers(store, key: str, world: int) -> None:
    """A barrier through the key-value store, not through gloo: the last rank to arrive opens it.

    ``store.wait`` releases the GIL while it blocks, so the watchdog thread can still end a rank whose
    peer never arrives (it is stuck in the learner's code).
    """
    if store.add(key, 1) == world:
        store.set(key + "/open", "1")
    else:
        store.wait([key + "/open"])


def start_watchdog(results: Results, address) -> Watchdog:
    """A watchdog writing with ``results`` (unsigned: a forged time-out can only cost points), with a store
    client of its own."""
    watchdog = Watchdog(results, dist.TCPStore(*address, is_master=False, timeout=PROCESS_GROUP_TIMEOUT))
    watchdog.start()
    return watchdog


def _exit_when_orphaned(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(70)


def in_own_process(run, results: Results, address) -> None:
    """Run ``run(store, watchdog)`` in a child forked from this process, with a store client and a watchdog
    of its own; end this rank the way the child ended (a time-out, a signal), or raise what it raised."""
    reader, writer = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child: threads do not survive a fork, so it starts the ones it needs
        os.close(reader)
        code = 0
        try:
            threading.Thread(target=_exit_when_orphaned, args=(parent,), daemon=True).start()
            run(dist.TCPStore(*address, is_master=False, timeout=PROCESS_GROUP_TIMEOUT),
                start_watchdog(results, address))  # the file was opened before the audit hook: in_rank.py
        except BaseException:
            os.write(writer, traceback.format_exc()[-4000:].encode())
            code = 1
        finally:
            os._exit(code)
    os.close(writer)
    chunks = []
    while chunk := os.read(reader, 4096):
        chunks.append(chunk)
    os.close(reader)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):  # die the same way, so the launcher reports it as the child's end
        os.kill(os.getpid(), os.WTERMSIG(status))
        signal.pause()
    code = os.waitstatus_to_exitcode(status)
    if code == 1 and chunks:
        raise RuntimeError("in a submission's process: " + b"".join(chunks).decode(errors="replace"))
    if code != 0:
        os._exit(code)
