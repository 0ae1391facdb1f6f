"""Grade a submission: read it, run its checks on real ranks, and turn what happened into a report.

The order of events, and why:

1. **Untouched stub?** Then "not attempted", at once: no rank is started for code that only raises
   ``NotImplementedError``.
2. **Syntax error?** Reported from here, with the line, before any process starts.
3. **Static scan** for forbidden collectives (``forbidden.py``).
4. **Checks on real ranks.** One ``dpteach.launch`` with as many ranks as the largest check needs; the
   ranks run every check in turn, in the order the exercise declares them (and the report lists them),
   each in a fresh world of its own size (``in_rank.py``). Starting ranks dominates the cost of grading (importing torch:
   a second or two of CPU in the launcher's zygote, ``dpteach/ranks/zygote.py``, against milliseconds for a check), which is why all checks share one launch
   rather than one launch per world - and why ``grade_many`` lets several submissions share it too.
5. **When a world dies** - a check ran past its limit, a rank crashed, or the check failed or the code
   raised on one rank while the others waited for it - finished checks keep their results, the running
   check gets the blame, and a new world runs the rest. A verdict a rank wrote before the world died is
   the blame (the first failure or exception, with its message; its peers were stopped: ``in_rank.py``).
   Only a hang or a crash skips the later checks of the same learner functions (a hang recurs, each
   time at the cost of a time limit and a new world). No rank outlives its launch.
6. **Judged again** (``judge.py``): every check that passed in its ranks is replayed from its recording
   in a process where no learner code ran, and counts as passed only if it passes there too. Only the
   verdict lines the ranks' own writer signed are read (``in_rank.py``): learner code in a rank could append
   lines of its own to the results file, not sign them.
7. **Score**: the points of the checks that passed; zero when a forbidden call was found, by reading or
   at run time, or when the learner's code tampered with the checks. The attempt is recorded in the
   progress store.
"""
from __future__ import annotations

import hmac
import json
import os
import secrets
import shutil
import tempfile
import time
import uuid
from pathlib import Path

from ..ranks.launcher import RankError, launch
from ..progress import ProgressStore
from . import forbidden as static
from .salts import new_keys
from ..network.traffic import countable
from .notebook import Submission, attempted, syntax_problem
from .judge import Judge, rejudge
from .in_rank import sign
from .report import CheckResult, Report, not_attempted
from .spec import Exercise
from .verdicts import blame, failed_outside_any_code_under_test, merge_ranks

LOAD_LIMIT = 20.0       # seconds for a rank to execute the learner's cells
GRADING_BUDGET = 120.0  # after this, checks left after a dead world are not started again
STARTUP_ALLOWANCE = 60.0


def grade(exercise: Exercise, submission: Submission, *, record: bool = True, namespace: dict | None = None,
          limit_scale: float | None = None, only=None) -> Report:
    """Grade ``submission`` against ``exercise``; record the attempt unless ``record=False``.

    ``limit_scale`` multiplies every time limit (default: ``$DPTEACH_GRADE_TIME_SCALE`` or 1; raise it on a
    very slow machine). ``only`` (check indexes) runs a subset - for the grader's own tests; the others
    are reported as not run, so such a report can never claim full marks.
    """
    return grade_many(exercise, [(submission, only)], record=record, namespace=namespace,
                      limit_scale=limit_scale)[0]


def grade_many(exercise: Exercise, submissions: list, *, record: bool = False, namespace: dict | None = None,
               limit_scale: float | None = None) -> list[Report]:
    """Grade several ``(submission, only)`` pairs of one exercise in as few worlds as possible."""
    started = time.monotonic()
    if limit_scale is None:
        limit_scale = float(os.environ.get("DPTEACH_GRADE_TIME_SCALE", "1"))
    reports, jobs = [], []
    for submission, only in submissions:
        if not attempted(exercise, submission):
            reports.append(not_attempted(exercise))
            continue
        report = Report(exercise.id, exercise.title, "failed", 0, exercise.max_score, rule=exercise.rule,
                        checks=[CheckResult(c.name, c.points, c.hidden, hint=c.hint) for c in exercise.checks])
        reports.append(report)
        report.error = syntax_problem(submission)
        if report.error is None:
            report.forbidden = [str(o) for o in static.scan(exercise, submission.files, namespace)]
            report.tampered += static.reaching(submission.files)
            jobs.append((submission, report, only))
    load_errors = _run_checks(exercise, jobs, limit_scale)
    for job, (_, report, _) in enumerate(jobs):
        report.error = load_errors.get(job)
    for report in reports:
        if report.status == "not_attempted":
            continue
        if report.error is not None:
            report.status = "error"
            for row in report.checks:
                row.message = "not run: the code could not be loaded"
        _score(report)
        report.elapsed_s = time.monotonic() - started
        if record:
            ProgressStore().record_exercise(Path(exercise.notebook_name).stem, report.score, report.max_score,
                                            report.status)
    return reports


def _score(report: Report) -> None:
    for row in report.checks:
        if row.outcome == "tampered" and row.message not in report.tampered:
            report.tampered.append(row.message)
    for row in report.checks:
        row.earned = row.points if row.passed and not report.forbidden and not report.tampered else 0
    report.score = sum(row.earned for row in report.checks)
    if report.status != "error":
        report.status = "passed" if report.score == report.max_score else "failed"


def _run_checks(exercise: Exercise, jobs: list, limit_scale: float) -> dict:
    """Run every job's checks, launching again after a world dies; fill each job's report.

    ``jobs``: ``(submission, report, only)``. Returns ``{job: message}`` for the jobs whose code could
    not be loaded.
    """
    checks = exercise.checks
    pending = []  # (job, check index) in the order the ranks run them
    for job, (_, report, only) in enumerate(jobs):
        chosen = range(len(checks)) if only is None else sorted(set(only))
        for i in set(range(len(checks))) - set(chosen):
            report.checks[i].message = "not run: this grading covered only some of the checks"
        pending += [(job, i) for i in chosen]  # in the order declared, which is the order the report lists
    deadline = time.monotonic() + GRADING_BUDGET
    load_errors: dict[int, str] = {}
    retried: set = set()  # checks whose world broke down outside anyone's code once already
    called: dict[int, set] = {}  # job -> forbidden functions the guard saw called
    finished: dict[tuple, dict] = {}  # (job, check) -> {rank: record}, merged once the judge has spoken
    judge = Judge() if pending else None  # every check is judged again: judge.py
    try:
        _run_worlds(exercise, jobs, pending, limit_scale, deadline, load_errors, retried, called, finished)
        rejudge(exercise.id, finished, judge)
    finally:
        if judge is not None:
            judge.close()
    for (job, i), per_rank in finished.items():
        merge_ranks(jobs[job][1].checks[i], per_rank)
    for job, names in called.items():
        jobs[job][1].forbidden += [f"{name} (called while your code ran)" for name in sorted(names)]
    return load_errors


def _run_worlds(exercise, jobs, pending, limit_scale, deadline, load_errors, retried, called, finished) -> None:
    """Launch worlds until every pending check has a result, a blame or a reason it was not run."""
    checks = exercise.checks
    while pending:
        records, failure = _launch(exercise, jobs, pending, limit_scale)
        if isinstance(failure, TypeError):  # raised by launch() before any rank started
            load_errors.update({job: f"your code cannot be sent to the ranks: {failure}" for job, _ in pending})
            break
        by_check: dict[tuple, dict] = {}
        timeouts: dict[tuple, dict] = {}
        loading_hung = False  # the world died while some job's cells were still being executed
        for r in records:
            if r.get("event") == "load_error":
                load_errors.setdefault(r["job"], r["text"])
            elif r.get("event") == "timeout" and r["check"][1] == "load":
                loading_hung = True
                load_errors.setdefault(r["check"][0], (
                    f"running your cells took longer than {LOAD_LIMIT:g} s before any check started: is "
                    f"there an endless loop (or a long computation) outside your functions?"))
            elif r.get("event") in ("timeout", "stopped"):  # keep the earliest: every rank's watchdog may fire
                key = tuple(r["check"])
                if key not in timeouts or r.get("at", 0.0) < timeouts[key].get("at", 0.0):
                    timeouts[key] = r
            elif r.get("event") == "check":  # only signed by the rank's writer; the first one counts
                by_check.setdefault((r["job"], r["check"]), {}).setdefault(r["rank"], r)
                called.setdefault(r["job"], set()).update(r["forbidden"])
        pending = [(job, i) for job, i in pending if job not in load_errors]
        done = [key for key in pending if len(by_check.get(key, {})) == checks[key[1]].world]
        for job, i in done:
            finished[(job, i)] = by_check[(job, i)]
        remaining = [key for key in pending if key not in done]
        if loading_hung and remaining:
            pending = remaining  # no check is to blame: a new world runs the other jobs' checks
            continue
        if not remaining or failure is None and not timeouts:
            pending = remaining
            if remaining:  # the world ended cleanly without them: should not happen, say so
                for job, i in remaining:
                    jobs[job][1].checks[i].outcome = "grader_error"
                    jobs[job][1].checks[i].message = "the grader lost this check's result - please report it"
            break
        broken = next((key for key in remaining if key in timeouts), remaining[0])
        job, index = broken
        if broken not in retried and failed_outside_any_code_under_test(failure, by_check.get(broken, {}),
                                                                         timeouts.get(broken)):
            retried.add(broken)  # e.g. gloo failing to connect a check's world under load: once more
            pending = remaining
            continue
        how = blame(jobs[job][1].checks[index], checks[index], by_check.get(broken, {}), timeouts.get(broken),
                     failure, limit_scale)
        after = [key for key in remaining if key != broken]
        skipped = [(j, i) for j, i in after if how and j == job and set(checks[index].uses) <= set(checks[i].uses)]
        for j, i in skipped:
            jobs[j][1].checks[i].outcome = "not_run"
            jobs[j][1].checks[i].message = (f"not run: {', '.join(checks[index].uses) or 'your code'} {how} in "
                                            f"the check '{checks[index].name}'; fix that first")
        pending = [key for key in after if key not in skipped]
        if pending and time.monotonic() > deadline:
            for j, i in pending:
                jobs[j][1].checks[i].message = "not run: the grading time budget was spent on earlier time-outs"
            break


def _launch(exercise: Exercise, jobs: list, pending: list, limit_scale: float):
    """One world for the ``pending`` (job, check) pairs; returns (all result records, the failure or None)."""
    results_dir = tempfile.mkdtemp(prefix="dpteach-grade-")
    scratch = tempfile.mkdtemp(prefix="dpteach-scratch-")  # a folder per rank inside: tampering.py
    order = list(dict.fromkeys(job for job, _ in pending))
    key = secrets.token_bytes(32)
    world = max(exercise.checks[i].world for _, i in pending)
    salt_keys, counts = new_keys(world), countable()  # the salts are the parent's: salts.py
    plan = {"exercise": exercise.id, "results_dir": results_dir, "nonce": uuid.uuid4().hex[:12], "key": key.hex(),
            "load_limit": LOAD_LIMIT, "limit_scale": limit_scale, "salt_keys": salt_keys, "scratch": scratch,
            "counts_traffic": counts,
            "jobs": [(job, jobs[job][0], [i for j, i in pending if j == job]) for job in order]}
    timeout = (STARTUP_ALLOWANCE + LOAD_LIMIT * len(order)
               + sum(exercise.checks[i].limit for _, i in pending) * limit_scale)
    failure = None
    try:
        from .in_rank import rank_main
        launch(rank_main, world, args=(plan,), device="cpu", backend="gloo", timeout=timeout,
               show_output=False, progress=False)
    except (RankError, TimeoutError, TypeError) as exc:
        failure = exc
    try:
        records = []
        for name in sorted(os.listdir(results_dir)):
            with open(os.path.join(results_dir, name), encoding="utf-8") as handle:
                records += [record for record in map(_parsed, handle) if _genuine(record, key)]
    finally:
        shutil.rmtree(results_dir, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)
    for record in records:  # what the judge needs from the parent, never from a rank: judge.py
        if record.get("event") == "check":
            record.update(salt_keys=salt_keys, counts_traffic=counts)
    return records, failure


def _parsed(line: str):
    try:
        return json.loads(line)
    except ValueError:
        return None


def _genuine(record, key: bytes) -> bool:
    """A verdict counts only with the rank writer's signature: learner code in the rank could append lines."""
    if not isinstance(record, dict):
        return False
    if record.get("event") not in ("check", "load_error"):
        return True  # time-outs and stops: the watchdog's, and a forged one can only cost points
    mac = record.pop("mac", None)
    return isinstance(mac, str) and hmac.compare_digest(mac, sign(key, record))
