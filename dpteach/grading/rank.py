"""What runs inside each rank while an exercise is graded.

One ``dpteach.launch`` starts as many ranks as the largest world any check needs, and the ranks then
go through the checks one by one. Each check gets a *fresh* default process group of exactly its own
size (``init_process_group`` over the launcher's key-value store, under a new prefix): the learner's
code sees a real world of W ranks, a check that leaves a stray message behind cannot confuse the next
one, and worlds of 1, 2, 3 and 4 ranks cost one start-up instead of four (starting a rank - a fresh
interpreter importing torch - is by far the most expensive thing in grading).

For every check each rank writes one JSON line to its own results file, with ``os.write`` on an
``O_APPEND`` descriptor, so a line is either whole or absent even if the rank is killed a moment later.
The parent process (``runner.py``) reads these files whatever happened to the world. A verdict line is
signed (HMAC, with a key the parent made for this launch and gave only to the rank's own writer): the
learner's code runs in the same process and could append lines of its own, but not sign them.

Before the learner's code is loaded, each rank takes the seal (``seal.py``) and adds the audit hook
(``tampering.py``); every return from the learner's code is a checkpoint against both (``learner.py``),
and so is the moment before a verdict is written.

Time limits are kept by a watchdog thread: when a check runs past its limit (an endless loop; a
deadlock, where every rank waits in a receive that nobody sends to) the watchdog writes a "timeout"
line and ends the rank at once. The launcher then stops the other ranks, and the runner starts a new
world for the checks that remain.

A check runs on every rank, and each rank judges on its own. So when rank 1's check fails (or its code
raises), rank 1 stops calling the learner's code - and its peers, still inside that code, wait for a
message rank 1 will never send. That wait is no deadlock of the learner's, and the verdict is already
known: rank 1 writes its line first, then says so in the key-value store, and each peer's watchdog,
seeing it, gives its rank a moment to finish and then ends it ("stopped", not "timeout"). The runner
reports rank 1's failure, with its message, in seconds rather than at the time limit.
"""
from __future__ import annotations

import gc
import hashlib
import hmac
import json
import os
import threading
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

from . import tampering
from .guard import ForbiddenCall, Guard
from .learner import Context, LearnerError, Tampered, trimmed_traceback
from .seal import Seal
from .spec import Fail, get_exercise

WATCHDOG_EXIT_CODE = 75
PROCESS_GROUP_TIMEOUT = timedelta(seconds=600)  # the watchdog acts long before this
PEER_FAILED_GRACE = 1.0  # seconds a rank may still take to finish a check that failed on a peer
POLL_INTERVAL = 0.1      # how often a watchdog asks the store whether a peer has failed the check


def sign(key: bytes, record: dict) -> str:
    """The MAC of a record (its JSON with sorted keys): the runner checks it with the same key."""
    return hmac.new(key, json.dumps(record, sort_keys=True).encode(), hashlib.sha256).hexdigest()


class _Results:
    """One JSON line per event, appended atomically to this rank's file; signed when given a key."""

    def __init__(self, path: str, rank: int, key: bytes | None = None):
        self.rank, self._key = rank, key
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, **record) -> None:
        record["rank"] = self.rank
        if self._key is not None:
            record["mac"] = sign(self._key, record)
        os.write(self.fd, (json.dumps(record) + "\n").encode())


class _Watchdog(threading.Thread):
    """Ends this rank when the armed check runs past its limit, after saying so in the results file - or,
    once a peer has failed the check, when this rank has not finished it ``grace`` seconds later.

    It asks the store through a client of its own: the main thread's client may be blocked in a wait.
    """

    def __init__(self, results: _Results, store=None):
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


def _wait_for_peers(store, key: str, world: int) -> None:
    """A barrier through the key-value store, not through gloo: the last rank to arrive opens it.

    ``store.wait`` releases the GIL while it blocks, so the watchdog thread can still end a rank whose
    peer never arrives (it is stuck in the learner's code).
    """
    if store.add(key, 1) == world:
        store.set(key + "/open", "1")
    else:
        store.wait([key + "/open"])


def rank_main(plan: dict) -> None:
    """Run the checks of ``plan["jobs"]`` - each a submission and the check indexes to run - on this rank.

    Usually there is one job: a learner's code. The grader's tests put several submissions of the same
    exercise in one launch (starting ranks is the expensive part), and so can an instructor's tool.
    """
    rank, size = dist.get_rank(), dist.get_world_size()
    exercise = get_exercise(plan["exercise"])
    path = os.path.join(plan["results_dir"], f"rank{rank}.jsonl")
    results = _Results(path, rank, key=bytes.fromhex(plan["key"]))  # held by this frame only: see sign()
    address = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    store = dist.TCPStore(*address, is_master=False, timeout=PROCESS_GROUP_TIMEOUT)
    watchdog = _Watchdog(_Results(path, rank), dist.TCPStore(*address, is_master=False, timeout=PROCESS_GROUP_TIMEOUT))
    watchdog.start()
    nonce = plan["nonce"]
    guard = Guard(exercise.forbidden, exercise.forbidden_methods).install()
    if exercise.warmup is not None and plan["jobs"]:
        exercise.warmup()  # before the seal: what torch changes in itself on first use is not the learner's doing
    tampering.install(protected=[plan["results_dir"]], secret=[os.environ.get("DPTEACH_PAYLOAD", "")])
    seal = Seal()  # after the guard's own wrappers, before any learner code: see seal.py
    gc.freeze()  # what exists now is the grader's and torch's: the collection before each verdict skips it
    dist.destroy_process_group()  # from here on, every check brings its own world
    for job, submission, order in plan["jobs"]:
        since = len(tampering.notes())  # what this job's code is seen doing, from its first line on
        watchdog.arm([job, "load"], plan["load_limit"])
        try:
            with guard.watching():  # top-level code too: a table of answers built from the grader's helpers
                namespace = submission.load()
            missing = [name for name in exercise.names if name not in namespace]
            if missing:
                raise NameError(f"the solution does not define {', '.join(missing)}")
        except BaseException as exc:  # their top-level code raised: nothing can be checked
            results.write(event="load_error", job=job, text=trimmed_traceback(exc, submission.files),
                          exc_type=type(exc).__name__)
            namespace = None
        watchdog.disarm()

        def checkpoint(final=False, since=since):
            found = seal.problems(final) + [f"your code {what}" for what in dict.fromkeys(tampering.notes()[since:])]
            if found:
                raise Tampered("; ".join(found))

        for index in order if namespace is not None else []:
            _run_check(plan, job, index, exercise, rank, store, namespace, guard, (seal, checkpoint), submission,
                       results, watchdog)

    # The launcher's worker tears down a default process group when we return: leave one in place.
    dist.init_process_group("gloo", store=dist.PrefixStore(f"{nonce}/end", store), rank=rank, world_size=size,
                            timeout=PROCESS_GROUP_TIMEOUT)


def _run_check(plan, job, index, exercise, rank, store, namespace, guard, sealed, submission, results, watchdog):
    check, (seal, checkpoint) = exercise.checks[index], sealed
    if rank >= check.world:
        return  # not part of this check's world; the next check's rendezvous waits for us
    prefix = f"{plan['nonce']}/job{job}/check{index}"
    guard.traffic.before_world()
    dist.init_process_group("gloo", store=dist.PrefixStore(prefix, store), rank=rank, world_size=check.world,
                            timeout=PROCESS_GROUP_TIMEOUT)
    guard.traffic.world_started()  # the sockets gloo opened for this world: see guard.Traffic
    # Armed only once the world is complete: a rank that skipped the smaller worlds waits here for its
    # peers, and that wait is not this check's time.
    scale = plan.get("limit_scale", 1.0)
    watchdog.arm([job, index], check.limit * scale, failed_key=prefix + "/failed", grace=PEER_FAILED_GRACE * scale)
    started = time.perf_counter()
    outcome = _run_one(check, rank, namespace, guard, checkpoint, submission.files)
    watchdog.settle()  # from here on a failing peer is no reason to stop this rank: it has its verdict
    gc.collect()  # the learner's objects the check dropped are finalized now, not while the verdict is written
    try:
        checkpoint(final=True)
    except Tampered as found:  # whatever the check concluded, it concluded with tools the learner's code changed
        outcome.pop("recording", None)
        outcome.update(outcome="tampered", message=str(found))
    changed = seal.changed_code()  # named in the report if the replay finds the check ran otherwise (judge.py)
    if changed:
        outcome["changed_code"] = changed
    results.write(event="check", job=job, check=index, seconds=round(time.perf_counter() - started, 3),
                  at=time.time(), **outcome)
    if outcome["outcome"] != "passed":  # written first: the runner must find this verdict when peers stop
        store.set(prefix + "/failed", str(rank))
    _wait_for_peers(store, prefix + "/done", check.world)
    dist.destroy_process_group()
    watchdog.disarm()


def _run_one(check, rank: int, namespace: dict, guard: Guard, checkpoint, learner_files) -> dict:
    seen = len(guard.calls)
    ctx = Context(rank, check.world, namespace, guard, learner_files, checkpoint)
    torch.manual_seed(1000 + rank)  # learner code that draws random numbers does so reproducibly
    hint = None
    try:
        check.run(ctx)
        outcome, message = "passed", ""
    except Tampered as found:
        outcome, message = "tampered", str(found)
    except Fail as failure:
        outcome, message, hint = "failed", str(failure), failure.hint
    except ForbiddenCall as call:
        outcome, message = "forbidden", str(call)
    except LearnerError as error:
        outcome, message = "error", error.text
    except Exception:  # the grader's own mistake: say so rather than blame the learner
        outcome, message = "grader_error", traceback.format_exc()
    finally:
        guard.clear_watches()
    # Only a pass needs its recording: the replay can confirm it or take it back (judge.py), never upgrade a failure.
    recorded = {"recording": ctx.recording} if outcome == "passed" and ctx.replayable else {}
    hinted = {"hint": hint} if hint else {}
    return {"outcome": outcome, "message": message, "forbidden": guard.calls[seen:], **recorded, **hinted}
