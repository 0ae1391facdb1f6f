"""What runs inside each rank while an exercise is graded.

One ``dpteach.launch`` starts as many ranks as the largest world any check needs, and the ranks then
go through the checks one by one. Each check gets a *fresh* default process group of exactly its own
size (``init_process_group`` over the launcher's key-value store, under a new prefix): the learner's
code sees a real world of W ranks, a check that leaves a stray message behind cannot confuse the next
one, and worlds of 1, 2, 3 and 4 ranks cost one start-up instead of four (starting ranks - importing torch,
once per grading in the launcher's zygote - is still the most expensive thing in grading).

For every check each rank writes one JSON line to its own results file, with ``os.write`` on an
``O_APPEND`` descriptor, so a line is either whole or absent even if the rank is killed a moment later.
The parent process (``runner.py``) reads these files whatever happened to the world. A verdict line is
signed (HMAC, with a key the parent made for this launch and gave only to the rank's own writer): the
learner's code runs in the same process and could append lines of its own, but not sign them.

Before the learner's code is loaded, each rank takes the seal (``seal.py``) and adds the audit hook
(``tampering.py``); every return from the learner's code is a checkpoint against both (``learner.py``),
and so is the moment before a verdict is written. Before that, too, it takes its own salt key out of the
plan and drops the others' (``salts.py``), removes the launch's payload from disk (every rank has read
it: all joined the world), and points ``TMPDIR`` at a scratch folder of its own (``tampering.py``). When
a launch holds several submissions, each runs in a process forked for it (``watchdog.in_own_process``).

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
import os
import tempfile
import time
import traceback
from functools import partial

import torch
import torch.distributed as dist

from . import salts, tampering
from .guard import ForbiddenCall, Guard
from .learner import Context, LearnerError, Tampered, trimmed_traceback
from .seal import Seal
from .spec import Fail, get_exercise
from .watchdog import (PEER_FAILED_GRACE, PROCESS_GROUP_TIMEOUT, WATCHDOG_EXIT_CODE, Results, in_own_process,  # noqa: F401
                       sign, start_watchdog, wait_for_peers)


def rank_main(plan: dict) -> None:
    """Run the checks of ``plan["jobs"]`` - each a submission and the check indexes to run - on this rank.

    Usually there is one job: a learner's code. The grader's tests put several submissions of the same
    exercise in one launch (starting ranks is the expensive part), and so can an instructor's tool.
    """
    rank, size = dist.get_rank(), dist.get_world_size()
    payload = os.environ.get("DPTEACH_PAYLOAD", "")
    try:  # every rank has read it (they all joined the world after loading it): no copy left on disk
        os.remove(payload)
    except OSError:
        pass
    exercise = get_exercise(plan["exercise"])
    path = os.path.join(plan["results_dir"], f"rank{rank}.jsonl")
    results = Results(path, rank, key=bytes.fromhex(plan.pop("key")))  # held by the writer only: see sign()
    salt_key = plan.pop("salt_keys")[rank]  # this rank's own; the others' are dropped here: salts.py
    address = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    store = dist.TCPStore(*address, is_master=False, timeout=PROCESS_GROUP_TIMEOUT)
    watchdog = start_watchdog(Results(path, rank), address)
    nonce = plan["nonce"]
    scratch = (plan["scratch"], os.path.join(plan["scratch"], f"rank{rank}"))
    os.makedirs(scratch[1], exist_ok=True)
    tempfile.tempdir = os.environ["TMPDIR"] = scratch[1]  # what libraries write on the learner's behalf goes here
    guard = Guard(exercise.forbidden, exercise.forbidden_methods, plan["counts_traffic"]).install()
    if exercise.warmup is not None and plan["jobs"]:
        exercise.warmup()  # before the seal: what torch changes in itself on first use is not the learner's doing
    tampering.install(protected=[plan["results_dir"]], secret=[payload], scratch=scratch)
    seal = Seal()  # after the guard's own wrappers, before any learner code: see seal.py
    gc.freeze()  # what exists now is the grader's and torch's: the collection before each verdict skips it
    dist.destroy_process_group()  # from here on, every check brings its own world
    isolate = len(plan["jobs"]) > 1  # several submissions: each in a process of its own (watchdog.py)
    for job, submission, order in plan["jobs"]:
        run = partial(_run_job, plan, job, submission, order, exercise, rank, guard, seal, results, salt_key)
        if isolate:
            in_own_process(partial(_fresh, seal, run), watchdog.results, address)
        else:
            run(store, watchdog)

    # The launcher's worker tears down a default process group when we return: leave one in place.
    dist.init_process_group("gloo", store=dist.PrefixStore(f"{nonce}/end", store), rank=rank, world_size=size,
                            timeout=PROCESS_GROUP_TIMEOUT)


def _fresh(seal, run, store, watchdog):
    seal.recount_threads()  # a forked child, no learner code loaded yet: watchdog.in_own_process
    run(store, watchdog)


def _run_job(plan, job, submission, order, exercise, rank, guard, seal, results, salt_key, store, watchdog):
    """Load one submission's cells and run its checks ``order`` on this rank."""
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

    def checkpoint(final=False):
        found = seal.problems(final) + [f"your code {what}" for what in dict.fromkeys(tampering.notes()[since:])]
        if found:
            raise Tampered("; ".join(found))

    for index in order if namespace is not None else []:
        salt = partial(salts.salt, salt_key, job, index)  # this rank's salts for this check: salts.py
        _run_check(plan, job, index, exercise, rank, store, namespace, guard, (seal, checkpoint, salt), submission,
                   results, watchdog)


def _run_check(plan, job, index, exercise, rank, store, namespace, guard, sealed, submission, results, watchdog):
    check, (seal, checkpoint, salt) = exercise.checks[index], sealed
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
    outcome = _run_one(check, rank, namespace, guard, checkpoint, submission.files, salt)
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
    wait_for_peers(store, prefix + "/done", check.world)
    dist.destroy_process_group()
    watchdog.disarm()


def _run_one(check, rank: int, namespace: dict, guard: Guard, checkpoint, learner_files, salt=None) -> dict:
    seen = len(guard.calls)
    ctx = Context(rank, check.world, namespace, guard, learner_files, checkpoint, salt)
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
