"""The clean process that judges every check again, and the rule that only two passes make a pass.

``replay.py`` says how a check is replayed from its recording; this module runs the replaying process
and merges its verdicts with the ranks'. The rule fails closed: a check passes only when it passed in
its ranks *and* passed again, from the recording, in a process where no learner code has run. Anything
else is not a pass:

* replayed and failed, after passing in the rank: the learner's code changed how its own process
  judged - ``tampered``;
* the replay could not follow the recording, or a passing rank sent none: the check ran otherwise in the
  rank than its code says (its code swapped, its recording switched off or cut short) - ``tampered``;
* no verdict at all (the judging process failed): ``grader_error``, reported as the grader's fault, and
  still not a pass.

A check that failed in its rank stays failed, with the rank's message: a replay can confirm a failure,
never overturn it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys


class Judge:
    """The clean process that replays checks: started before the ranks (its imports overlap their start,
    and it has every check module loaded before any learner code runs), asked once, at the end."""

    def __init__(self):
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "DPTEACH_GPUS": "0"}
        self.process = subprocess.Popen([sys.executable, "-m", "dpteach.grading.replay"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    def verdicts(self, requests: list[dict], timeout: float = 120.0) -> dict:
        """``{request key: verdict}``; raises RuntimeError (with the judge's last words) if it fails."""
        payload = "".join(json.dumps(request) + "\n" for request in requests)
        try:
            out, err = self.process.communicate(payload, timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.communicate()
            raise RuntimeError(f"the judging process gave no verdict within {timeout:g} s") from None
        verdicts = {}
        for line in out.splitlines():
            verdict = json.loads(line)
            verdicts[verdict.pop("key")] = verdict
        if self.process.returncode != 0 or len(verdicts) != len(requests):
            raise RuntimeError(f"the judging process exited with code {self.process.returncode}: "
                               f"{err.strip().splitlines()[-1] if err.strip() else 'no message'}")
        return verdicts

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate()


def _changed(record: dict) -> str:
    names = record.get("changed_code") or []
    return f" (it changed the code of {', '.join(names[:3])}{' and more' if len(names) > 3 else ''})" if names else ""


def _gathers(per_rank: dict) -> dict:
    """What each rank recorded putting into the grader's all-gathers: what the judge answers them with."""
    return {str(rank): [event["gather"] for event in record.get("recording", []) if "gather" in event]
            for rank, record in per_rank.items()}


def rejudge(exercise_id: str, finished: dict, judge: "Judge | None") -> None:
    """Give every rank result of ``finished`` (``{(job, check): {rank: record}}``) its final verdict.

    Only checks that passed on every rank are replayed (a failure stays a failure, and a check with one
    is failed whatever its other ranks say). The judge gets from the parent what it must not take from a
    rank: every rank's salt key (the parent added them to the records it read) and, for each all-gather
    of the grader's, what every rank put in."""
    whole = {key for key, per_rank in finished.items() if all(r["outcome"] == "passed" for r in per_rank.values())}
    requests = [{"key": f"{job}/{index}/{rank}", "exercise": exercise_id, "check": index, "rank": rank,
                 "world": len(per_rank), "recording": record["recording"], "job": job,
                 "keys": record.get("salt_keys"), "gathers": _gathers(per_rank)}
                for (job, index), per_rank in finished.items() for rank, record in per_rank.items()
                if "recording" in record and (job, index) in whole]
    verdicts, unconfirmed = {}, "no judging process"
    if requests:
        try:
            verdicts = judge.verdicts(requests) if judge is not None else {}
        except RuntimeError as problem:
            unconfirmed = str(problem)
    for (job, index), per_rank in finished.items():
        for rank, record in per_rank.items():
            if record["outcome"] != "passed":
                continue
            record.pop("hint", None)
            verdict = verdicts.get(f"{job}/{index}/{rank}")
            if "recording" in record and (job, index) not in whole:
                continue  # not replayed: a peer failed, and with it the check
            if "recording" not in record:
                record.update(outcome="tampered", message=(
                    "this check passed inside your ranks but came back without the record of what your code "
                    "returned, so it could not be judged again outside them: your code switched the recording "
                    "off" + _changed(record)))
            elif verdict is None or verdict["outcome"] == "grader_error":
                reason = verdict["message"] if verdict else unconfirmed
                record.update(outcome="grader_error", message=(
                    f"this check could not be judged again outside the ranks ({reason}), so its pass does not "
                    f"count"))
            elif verdict["outcome"] == "failed":
                record.update(outcome="tampered", message=(
                    "inside your ranks this check passed, but judged again outside them, with a torch your code "
                    "never touched, it fails: " + verdict["message"] + ". Your code changed how its own process "
                    "compares results" + _changed(record)))
            elif verdict["outcome"] == "not_replayable":
                record.update(outcome="tampered", message=(
                    "inside your ranks this check passed, but judged again outside them it could not retrace "
                    "what happened inside them (" + verdict["message"] + "). Your code changed how the check ran "
                    "in its own process" + _changed(record)))
