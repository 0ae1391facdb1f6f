"""What runs inside each rank while an exercise is graded.

One ``dpteach.launch`` starts as many ranks as the largest world any check needs, and the ranks then
go through the checks one by one. Each check gets a *fresh* default process group of exactly its own
size (``init_process_group`` over the launcher's key-value store, under a new prefix): the learner's
code sees a real world of W ranks, a check that leaves a stray message behind cannot confuse the next
one, and worlds of 1, 2, 3 and 4 ranks cost one start-up instead of four (starting a rank - a fresh
interpreter importing torch - is by far the most expensive thing in grading).

For every check each rank writes one JSON line to its own results file, with ``os.write`` on an
``O_APPEND`` descriptor, so a line is either whole or absent even if the rank is killed a moment later.
The parent process (``runner.py``) reads these files whatever happened to the world.

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

import json
import os
import threading
import time
import traceback
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist

from .guard import ForbiddenCall, Guard
from .replay import encode, is_data, record_call
from .seal import Seal
from .spec import Fail, get_exercise

WATCHDOG_EXIT_CODE = 75
PROCESS_GROUP_TIMEOUT = timedelta(seconds=600)  # the watchdog acts long before this
PEER_FAILED_GRACE = 1.0  # seconds a rank may still take to finish a check that failed on a peer
POLL_INTERVAL = 0.1      # how often a watchdog asks the store whether a peer has failed the check


class LearnerError(Exception):
    """The learner's code raised; ``text`` is the traceback trimmed to the learner's own lines."""

    def __init__(self, text: str, exc_type: str):
        super().__init__(text)
        self.text, self.exc_type = text, exc_type


def trimmed_traceback(exc: BaseException, learner_files) -> str:
    """The traceback of ``exc`` showing only frames from the learner's cells (the last frame if none)."""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [frame for frame in frames if frame.filename in learner_files] or frames[-1:]
    lines = ["Traceback (your code only, most recent call last):\n"]
    lines += traceback.format_list(mine)
    lines += traceback.format_exception_only(type(exc), exc)
    return "".join(lines).rstrip()


class Context:
    """What a check's ``run(ctx)`` sees: its rank and world, and a safe way to call the learner's code."""

    def __init__(self, rank: int, world: int, namespace: dict, guard: Guard, learner_files):
        self.rank, self.world = rank, world
        self.namespace, self.guard, self.learner_files = namespace, guard, learner_files
        self.recording: list[dict] = []  # what the replay outside the ranks needs (replay.py)
        # False once the check reaches for what a recording of values cannot carry: the learner's objects
        # themselves, learner code run outside ``call``, its own communication, or a call given a live
        # object (a model, an optimizer). Such a check is judged here only, under the seal.
        self.replayable = True

    def learner(self, name: str):
        self.replayable = False
        return self.namespace[name]

    def call(self, name: str, *args, **kwargs):
        """Run the learner's ``name(*args, **kwargs)`` with the guard watching; record what it left."""
        if not all(is_data(value) for value in (*args, *kwargs.values())):
            self.replayable = False
        with self._watched():
            result = self.namespace[name](*args, **kwargs)
        self.recording.append(record_call(name, args, result))
        return result

    def sent_elements(self) -> int:
        """Elements this rank's learner code has sent so far (the guard's count), recorded for the replay."""
        count = self.guard.sent_elements
        self.recording.append({"sent": count})
        return count

    def all_gather(self, tensor: torch.Tensor) -> list:
        """The grader's own all-gather (never counted as the learner's traffic), recorded for the replay."""
        gathered = [torch.empty_like(tensor) for _ in range(self.world)]
        with self.guard.allow():
            dist.all_gather(gathered, tensor)
        self.recording.append({"gathered": encode(gathered)})
        return gathered

    def running_learner_code(self):
        """Everything inside is the learner's doing: watched, and its exceptions become LearnerError."""
        self.replayable = False
        return self._watched()

    @contextmanager
    def _watched(self):
        with self.guard.watching():
            try:
                yield
            except (Fail, ForbiddenCall):
                raise
            except BaseException as exc:  # SystemExit and KeyboardInterrupt from their code, too
                raise LearnerError(trimmed_traceback(exc, self.learner_files), type(exc).__name__) from None

    def allow(self):
        """The grader's own communication inside a learner window (see ``Guard.allow``)."""
        self.replayable = False
        return self.guard.allow()

    def fail(self, message: str):
        raise Fail(message)


class _Results:
    """One JSON line per event, appended atomically to this rank's file."""

    def __init__(self, path: str, rank: int):
        self.rank = rank
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, **record) -> None:
        record["rank"] = self.rank
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
    results = _Results(os.path.join(plan["results_dir"], f"rank{rank}.jsonl"), rank)
    address = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    store = dist.TCPStore(*address, is_master=False, timeout=PROCESS_GROUP_TIMEOUT)
    watchdog = _Watchdog(results, dist.TCPStore(*address, is_master=False, timeout=PROCESS_GROUP_TIMEOUT))
    watchdog.start()
    nonce = plan["nonce"]
    guard = Guard(exercise.forbidden, exercise.forbidden_methods).install()
    seal = Seal()  # after the guard's own wrappers, before any learner code: see seal.py
    dist.destroy_process_group()  # from here on, every check brings its own world
    warm = False
    for job, submission, order in plan["jobs"]:
        watchdog.arm([job, "load"], plan["load_limit"])
        try:
            namespace = submission.load()
            missing = [name for name in exercise.names if name not in namespace]
            if missing:
                raise NameError(f"the solution does not define {', '.join(missing)}")
        except BaseException as exc:  # their top-level code raised: nothing can be checked
            results.write(event="load_error", job=job, text=trimmed_traceback(exc, submission.files),
                          exc_type=type(exc).__name__)
            namespace = None
        if namespace is not None and exercise.warmup is not None and not warm:
            exercise.warmup()
            warm = True
        watchdog.disarm()
        for index in order if namespace is not None else []:
            _run_check(plan, job, index, exercise, rank, store, namespace, guard, seal, submission, results, watchdog)

    # The launcher's worker tears down a default process group when we return: leave one in place.
    dist.init_process_group("gloo", store=dist.PrefixStore(f"{nonce}/end", store), rank=rank, world_size=size,
                            timeout=PROCESS_GROUP_TIMEOUT)


def _run_check(plan, job, index, exercise, rank, store, namespace, guard, seal, submission, results, watchdog):
    check = exercise.checks[index]
    if rank >= check.world:
        return  # not part of this check's world; the next check's rendezvous waits for us
    prefix = f"{plan['nonce']}/job{job}/check{index}"
    dist.init_process_group("gloo", store=dist.PrefixStore(prefix, store), rank=rank, world_size=check.world,
                            timeout=PROCESS_GROUP_TIMEOUT)
    # Armed only once the world is complete: a rank that skipped the smaller worlds waits here for its
    # peers, and that wait is not this check's time.
    scale = plan.get("limit_scale", 1.0)
    watchdog.arm([job, index], check.limit * scale, failed_key=prefix + "/failed", grace=PEER_FAILED_GRACE * scale)
    started = time.perf_counter()
    outcome = _run_one(check, rank, namespace, guard, submission.files)
    watchdog.settle()  # from here on a failing peer is no reason to stop this rank: it has its verdict
    replaced = seal.broken()
    if replaced:  # whatever the check concluded, it concluded with tools the learner's code had replaced
        outcome.update(outcome="tampered", replaced=replaced,
                       message=f"your code replaced {_listing(replaced)}, which the checks use to judge it")
    results.write(event="check", job=job, check=index, seconds=round(time.perf_counter() - started, 3),
                  at=time.time(), **outcome)
    if outcome["outcome"] != "passed":  # written first: the runner must find this verdict when peers stop
        store.set(prefix + "/failed", str(rank))
    _wait_for_peers(store, prefix + "/done", check.world)
    dist.destroy_process_group()
    watchdog.disarm()


def _listing(names: list[str], most: int = 4) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _run_one(check, rank: int, namespace: dict, guard: Guard, learner_files) -> dict:
    seen = len(guard.calls)
    ctx = Context(rank, check.world, namespace, guard, learner_files)
    torch.manual_seed(1000 + rank)  # learner code that draws random numbers does so reproducibly
    hint = None
    try:
        check.run(ctx)
        outcome, message = "passed", ""
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
    replay = check.replay and ctx.replayable and outcome in ("passed", "failed")
    recorded = {"recording": ctx.recording} if replay else {}
    hinted = {"hint": hint} if hint else {}
    return {"outcome": outcome, "message": message, "forbidden": guard.calls[seen:], **recorded, **hinted}
