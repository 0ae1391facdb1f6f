"""How the ranks' records of one check become its row in the report: merged when the check finished on
every rank, blamed when its world died first.

Each rank judges on its own and writes its own record, so a check has up to W verdicts, and a world can
die with some of them missing (a time-out, a crash, peers stopped after one rank failed: ``in_rank.py``). One
record has to speak for the check, and it must be the one that explains the others: what zeroes the
exercise (tampering, a forbidden call) first, then the first exception (its peers' errors are usually its
echo: "connection reset by peer"), then the lowest rank whose result was wrong.
"""
from __future__ import annotations

import signal

from ..ranks.launcher import RankError
from .in_rank import WATCHDOG_EXIT_CODE
from .report import CheckResult


def _first_raised(records: list) -> dict:
    """The rank whose code raised first: when one rank fails, its peers often fail a moment later *because*
    of it ("connection reset by peer"), and it is the first error that explains the others."""
    return min(records, key=lambda r: (r.get("at", 0.0), r["rank"]))


SEVERITY = ("tampered", "forbidden", "error", "grader_error", "failed")
NATIVE = " (a crash in native code: for example a tensor used after its memory was freed)"
CRASH_NOTES = {"SIGABRT": " (the C++ side aborted; with gloo that is typically a message whose size does not match the "
                          "receive posted for it - check which chunk each rank sends and receives)",
               "SIGSEGV": NATIVE, "SIGBUS": NATIVE, "SIGILL": NATIVE, "SIGFPE": NATIVE}


def merge_ranks(row: CheckResult, per_rank: dict) -> None:
    """A check passes when it passed on every rank; otherwise one failing rank speaks for it: a forbidden
    call first, then the first exception, then the lowest rank whose result was wrong."""
    failing = [per_rank[r] for r in sorted(per_rank) if per_rank[r]["outcome"] != "passed"]
    if not failing:
        row.passed, row.outcome, row.message = True, "passed", ""
        return
    worst_kind = min(SEVERITY.index(r["outcome"]) for r in failing)
    same_kind = [r for r in failing if SEVERITY.index(r["outcome"]) == worst_kind]
    verdicts = SEVERITY[worst_kind] in ("failed", "tampered")  # conclusions, not exceptions with echoes
    worst = same_kind[0] if verdicts else _first_raised(same_kind)
    row.outcome = worst["outcome"]
    row.hint = worst.get("hint") or row.hint  # the failure's own hint, when it has one
    prefix = f"rank {worst['rank']}: " if len(per_rank) > 1 else ""
    row.message = prefix + worst["message"]
    echoes = [r for r in same_kind if r is not worst] if not verdicts else []
    if echoes:  # peers that raised *after* it were waiting for it (e.g. "connection reset by peer")
        row.message += f"\n(the other ranks were left waiting for rank {worst['rank']} and failed after it)"
    if row.outcome == "grader_error":
        row.message = "the grader itself failed on this check - please report it:\n" + worst["message"]


def blame(row: CheckResult, check, per_rank: dict, timeout: dict | None, failure, limit_scale: float):
    """The check that was running when its world died: why, as precisely as the records allow. Returns how
    the learner's code ended when later checks of its functions are to be skipped (a hang or a crash: it
    recurs, each time at a new world's cost), or None when a rank's own verdict explains the death.

    ``timeout``: the earliest watchdog record ("timeout" at the limit; "stopped" after a peer failed). A
    verdict written before it is the cause: a rank whose check failed or whose code raised stops calling the
    learner's code, and its peers wait for it there (``in_rank.py``). An exception *after* it is an echo: in a
    deadlock the first watchdog ends its rank, and a peer's receive fails ("connection reset by peer")
    moments before its own watchdog would fire; blaming it would call a hang a crash.
    """
    spoke = [per_rank[r] for r in sorted(per_rank) if per_rank[r]["outcome"] != "passed"
             and (timeout is None or per_rank[r].get("at", 0.0) < timeout.get("at", float("inf")))]
    # A rank that died outright, with no Python exception: it ended its own process (os._exit, a signal) or
    # crashed in native code. The launcher notices at once, and the others' errors are its echo.
    crashed = (isinstance(failure, RankError) and failure.rank not in per_rank and not failure.exc_type
               and failure.exit_code not in (WATCHDOG_EXIT_CODE, None))
    if crashed:
        code = failure.exit_code
        how = f"ended its own process with exit code {code} (os._exit or sys.exit outside the main thread?)"
        if code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
            how = f"was killed by {name}" + CRASH_NOTES.get(name, "")
        row.outcome = "error"
        row.message = (f"rank {failure.rank} {how} during the check '{check.name}'; the other ranks lost their "
                       f"connection to it and were stopped")
        return "crashed"
    if spoke:
        # What zeroes the exercise (tampering, a forbidden call) speaks first; otherwise the first to speak.
        zeroing = [r for r in spoke if r["outcome"] in ("tampered", "forbidden")]
        first = _first_raised(zeroing or spoke)
        row.outcome = first["outcome"]
        row.hint = first.get("hint") or row.hint
        row.message = (f"rank {first['rank']}: {first['message']}\n(the other ranks were left waiting for "
                       f"rank {first['rank']} and were stopped)")
        if row.outcome == "grader_error":
            row.message = "the grader itself failed on this check - please report it:\n" + first["message"]
        return None
    if timeout is not None or isinstance(failure, TimeoutError) or (
            isinstance(failure, RankError) and failure.exit_code == WATCHDOG_EXIT_CODE):
        row.outcome = "timed_out"
        row.message = (f"timed out after {check.limit * limit_scale:g} s on W={check.world}: an endless loop, "
                       f"or a deadlock (a receive that no rank sends to, or ranks that disagree on the "
                       f"order of their messages). Every rank was stopped.")
        how = "did not finish (timed out)"
    elif isinstance(failure, RankError):
        row.outcome = "error"
        row.message = f"rank {failure.rank} exited with code {failure.exit_code} during this check, without a result"
        how = "crashed"
    else:
        row.outcome = "error"
        row.message = f"the world stopped during this check: {failure}"
        how = "crashed"
    if failed_outside_any_code_under_test(failure, per_rank, timeout):
        row.message = "the grader itself failed on this check - please report it:\n" + str(failure)
    return how


def failed_outside_any_code_under_test(failure, per_rank: dict, timeout: dict | None) -> bool:
    """A rank raised in the grader's own code around a check - joining or leaving the check's world -
    with no learner exception, time-out or crash to explain it. gloo's connect on a loaded machine
    fails that way now and then; a grader bug does too, and then it fails again when retried."""
    return (isinstance(failure, RankError) and bool(failure.exc_type) and timeout is None
            and not any(r["outcome"] != "passed" for r in per_rank.values()))
