"""Ranks forked from one grading rank, joined by gloo, that die for real: the worlds a check of what survives
a kill runs in (exercise 10's).

The grader's other processes are the launch's ranks (``dpteach/ranks/processes.py``) and the one forked child
per submission (``watchdog.in_own_process``); this module adds the worlds a check starts inside a grading
rank. Exercise 10 is graded on what survives a kill. So the ranks that train and save must be real processes
that really end - ``Fault("kill")`` (``dpteach/ranks/faults.py``): SIGKILL, no cleanup, no last words -
and the ranks that resume must be fresh processes that never saw the dead ones' memory: whatever the
learner's code kept anywhere but on disk is gone.

**Why forked, and why all from one grading rank.** A fresh interpreter importing torch costs seconds; a
fork costs milliseconds, and a check here starts three worlds (the uninterrupted run, the run that is
killed, the resumed one). A child starts with the grader's seal, guard and audit hook already in place
(``seal.py``, ``guard.py``, ``tampering.py``), so the learner's code runs in it under the same watch as
anywhere else. And all of them are children of one grading rank, so they share its scratch folder - the
one place the learner's code may write (``tampering.py``), and the checkpoint folder that every rank of
the killed run writes into and every rank of the resumed run, at any W, reads from.

Each child joins a world of its own as rank r of W: gloo, over the launch's key-value store under a
fresh prefix. The check's own world of one is set aside meanwhile (:func:`check_world_set_aside`): a
forked child can neither tear down its parent's process group (it waits on threads that were not forked)
nor start a second default one beside it.

**What comes back.** Each child writes messages into a pipe of its own, each signed with a key made for
this world (HMAC-SHA256, ``watchdog.mac``, as the ranks sign their verdicts: ``in_rank.py``): the learner's
code may write into the pipe, not sign. A child ends at once, saying so, the moment the audit hook notes
tampering, before the learner's code could forge anything with what it reached. When the planned victim has
died, the parent stops the others, as torchrun stops a job when one of its workers dies.
"""
from __future__ import annotations

import _thread
import hmac
import os
import pickle
import secrets
import select
import signal
import struct
import sys
import threading
import time
import traceback
import uuid
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist

from . import tampering
from .guard import ForbiddenCall
from .learner import LearnerError, Tampered
from .spec import Fail
from .watchdog import mac

CHILD_TIMEOUT = timedelta(seconds=60)  # a child's collectives; the check's own time limit acts long before
GRACE = 2.0  # seconds the other children get to end on their own once one has failed, or the victim has died
LEARNERS = {"LearnerError": LearnerError, "Tampered": Tampered, "Fail": Fail, "ForbiddenCall": ForbiddenCall}


@contextmanager
def check_world_set_aside():
    """Take down the check's world of one for the block, and start a new one after it (in_rank.py ends it)."""
    address = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    initialized = dist.is_initialized()
    if initialized:
        if dist.get_world_size() != 1:
            raise RuntimeError("exercise 10's checks run in a world of one grading rank, which forks the ranks")
        dist.destroy_process_group()
    try:
        yield address
    finally:
        if not initialized:
            return
        store = dist.TCPStore(*address, is_master=False, timeout=CHILD_TIMEOUT)
        dist.init_process_group("gloo", store=dist.PrefixStore(f"ex10/{uuid.uuid4().hex}", store), rank=0,
                                world_size=1, timeout=CHILD_TIMEOUT)


def run_world(address, size: int, body, *args, victim: int | None = None, name: str = "the run") -> list[dict]:
    """Fork ``size`` ranks, each running ``body(send, *args)`` in a world of ``size``; per rank, what it sent:
    ``{"result", "saved", "ended"}``. ``victim``: the rank whose planned kill ends this world (its peers are
    stopped then). Raises what the learner's code raised first, in whichever rank; ``name`` says which run."""
    key, prefix = secrets.token_bytes(32), f"ex10/{uuid.uuid4().hex}"
    threads = _thread._count()
    children = {}  # pipe -> (rank, pid)
    for rank in range(size):
        reader, writer = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(reader)
            _child(rank, size, prefix, address, key, writer, threads, body, args)
        os.close(writer)
        children[reader] = (rank, pid)
    return _collect(children, key, size, victim, name)


def _child(rank, size, prefix, address, key, writer, threads, body, args) -> None:
    def send(kind, payload=None):
        data = pickle.dumps((kind, time.time(), payload))
        os.write(writer, struct.pack("!I", len(data)) + mac(key, data) + data)

    code = 0
    try:
        _same_thread_count(threads)
        _end_on_tampering(send)
        torch.set_num_threads(1)  # W ranks share the cores, as the launcher arranges for its ranks
        store = dist.TCPStore(*address, is_master=False, timeout=CHILD_TIMEOUT)
        dist.init_process_group("gloo", store=dist.PrefixStore(prefix, store), rank=rank, world_size=size,
                                timeout=CHILD_TIMEOUT)
        send("result", body(send, *args))
    except BaseException as exc:  # noqa: BLE001 - every ending is reported to the parent, and judged there
        kind = type(exc).__name__ if type(exc).__name__ in LEARNERS else "grader"
        text = exc.text if isinstance(exc, LearnerError) else str(exc) if kind != "grader" else traceback.format_exc()
        send("error", {"kind": kind, "text": text[-4000:], "exc_type": getattr(exc, "exc_type", kind),
                       "hint": getattr(exc, "hint", None)})
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _same_thread_count(threads: int) -> None:
    """The seal counts the Python threads (``seal.py``); a Python whose fork resets that count would make every
    learner call in a child look like one that left threads running. Threads that wait forever put it back."""
    for _ in range(threads - _thread._count()):
        threading.Thread(target=threading.Event().wait, daemon=True).start()


def _end_on_tampering(send) -> None:
    """End this child the moment the audit hook notes the learner's code reaching where it may not: a note
    otherwise waits for the next checkpoint, and a child can be made to exit before it."""
    seen = len(tampering.notes())

    def hook(event, args):
        notes = tampering.notes()
        if len(notes) > seen:
            send("error", {"kind": "Tampered", "text": "; ".join(dict.fromkeys(f"your code {n}" for n in notes[seen:])),
                           "exc_type": "Tampered", "hint": None})
            os._exit(1)

    sys.addaudithook(hook)


def _collect(children: dict, key: bytes, size: int, victim, name: str) -> list[dict]:
    """Read every child's signed messages until all have ended; stop the rest once the victim died or one failed."""
    # "struck": False, or when the victim said it was about to be killed
    seen = [{"result": None, "saved": [], "errors": [], "struck": False, "ended": None} for _ in range(size)]
    buffers = {fd: b"" for fd in children}
    pids = {rank: pid for rank, pid in children.values()}
    open_ = dict(children)
    stop_at = None
    while open_:
        ready, _, _ = select.select(list(open_), [], [], 0.1)
        for fd in ready:
            chunk = os.read(fd, 1 << 16)
            rank = open_[fd][0]
            if not chunk:
                os.close(fd)
                del open_[fd]
                continue
            buffers[fd] += chunk
            buffers[fd] = _messages(buffers[fd], key, seen[rank])
        # Once the victim is dead, its peers get a moment to end as a job's surviving workers do: a save under
        # way is finished or fails, and the next collective fails. Then, as torchrun would, the rest are stopped.
        struck = victim is not None and seen[victim]["struck"] and all(r != victim for r, _ in open_.values())
        failed = any(s["errors"] for s in seen)
        if stop_at is None and (struck or failed):
            stop_at = time.monotonic() + GRACE
        if stop_at is not None and time.monotonic() >= stop_at:
            for fd, (rank, pid) in list(open_.items()):
                _kill(pid)
                seen[rank]["ended"] = "stopped"
    for rank, pid in pids.items():
        _, status = os.waitpid(pid, 0)
        if seen[rank]["ended"] is None:
            seen[rank]["ended"] = _how(status)
    _raise_first(seen, victim, name)
    return seen


def _messages(buffer: bytes, key: bytes, into: dict) -> bytes:
    """Take the whole messages off ``buffer`` into ``into``; messages that are not signed are dropped."""
    while len(buffer) >= 36:
        length = struct.unpack("!I", buffer[:4])[0]
        if len(buffer) < 36 + length:
            break
        signature, data, buffer = buffer[4:36], buffer[36:36 + length], buffer[36 + length:]
        if not hmac.compare_digest(signature, mac(key, data)):
            continue
        kind, at, payload = pickle.loads(data)
        if kind == "error":
            into["errors"].append((at, payload))
        elif kind == "saved":
            into["saved"].append(payload)
        elif kind == "strike":
            into["struck"] = at
        elif kind == "result":
            into["result"] = payload
    return buffer


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _how(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit code {os.waitstatus_to_exitcode(status)}"


def _raise_first(seen: list, victim, name: str) -> None:
    """The learner's failure first (tampering before all), in the order the ranks met them; a rank that ended
    without a word; then the grader's own - unless the planned kill explains it: once the victim is dead, a
    peer fails in its next collective (in the learner's save as much as in the grader's step), and that
    failure is the kill's doing. Tampering is never the kill's doing."""
    struck_at = seen[victim]["struck"] if victim is not None else False
    errors = sorted(((at, rank, e) for rank, s in enumerate(seen) for at, e in s["errors"]
                     if struck_at is False or at < struck_at or e["kind"] == "Tampered"), key=lambda e: e[:2])
    for kinds in (("Tampered",), tuple(LEARNERS)):
        for _, rank, error in errors:
            if error["kind"] in kinds:
                cls = LEARNERS[error["kind"]]
                if cls is LearnerError:
                    raise LearnerError(f"{error['text']}\n(on rank {rank} of {name}, W={len(seen)})", error["exc_type"])
                raise cls(error["text"], error["hint"]) if cls is Fail else cls(error["text"])
    struck = struck_at is not False
    for rank, s in enumerate(seen):
        if s["result"] is None and not s["errors"] and not (struck and (rank == victim or s["ended"] == "stopped")):
            raise LearnerError(f"rank {rank} of {name} (W={len(seen)}) ended its process ({s['ended']}) before it "
                               f"was done, without an exception: did your code end it?", "SystemExit")
    if errors and not struck:
        raise RuntimeError(f"rank {errors[0][1]} of {name} (W={len(seen)}): {errors[0][2]['text']}")
