"""The verdict, reached again where no learner code has run: record in the rank, replay in a clean process.

A check runs in a rank, next to the learner's code, and judges it with torch. Whatever the learner's code
did to that process (``torch.equal = lambda a, b: True``, a rewritten ``Tensor.__eq__``, a patched
dpteach helper) can sway the comparison there; the seal (``seal.py``) notices the common ways, not all.
So for every check that talks to the learner only through ``ctx.call`` and its own bookkeeping, the
rank also *records* what happened:

* each ``ctx.call``: what the learner's function returned, and what each tensor argument held after it;
* each reading of the traffic counter (``ctx.sent_elements()``) and each grader collective
  (``ctx.all_gather``): the numbers and tensors the rank saw.

Recorded tensors travel as raw bytes with dtype and shape. After the ranks finish, ``python -m
dpteach.grading.replay`` - a process that imports torch and the grader and nothing of the learner's -
runs the same check function again with a context that answers each call from the recording instead
of calling the learner. The check draws the same inputs (same seeds), builds the same expected values
with an untouched torch and reaches its own verdict. That verdict is the one that counts; when it
differs from the rank's, the learner's code changed how its process judges, and the report says so
(scored like any other tampering: 0).

Checks that hand the learner live objects (a model, a DDP wrapper, a process group of its own) cannot
be replayed from a recording. The rank's context notices that by itself (``Context.replayable``: the
check used ``ctx.learner``, ``ctx.allow`` or ``ctx.running_learner_code``, or passed a call something
other than tensors and plain values) and sends no recording; such checks rely on the seal. A check whose
*results* a recording cannot carry - views that share one buffer - sets ``replay=False``.
"""
from __future__ import annotations

import base64
import json
import sys

import torch

DTYPES = {str(dtype): dtype for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
                                          torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)}


class NotReplayable(Exception):
    """The check did something a recording cannot answer; mark it ``replay=False``."""


# -- plain data from the rank's values ---------------------------------------------------------------

def encode(value, args=()):
    """JSON-able data for ``value``; a tensor that *is* one of ``args`` is recorded as that argument."""
    if isinstance(value, torch.Tensor):
        for index, arg in enumerate(args):
            if value is arg:
                return {"arg": index}
        flat = value.detach().cpu().contiguous().reshape(-1)
        raw = flat.view(torch.uint8) if flat.dtype != torch.bool else flat.to(torch.uint8)
        return {"tensor": str(value.dtype), "shape": list(value.shape),
                "bytes": base64.b64encode(bytes(raw.numpy().tobytes())).decode()}
    if isinstance(value, (list, tuple)):
        return {"seq": [encode(item, args) for item in value], "tuple": isinstance(value, tuple)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"plain": value}
    return {"other": type(value).__name__}


def decode(data, args=()):
    if "arg" in data:
        return args[data["arg"]]
    if "tensor" in data:
        dtype = DTYPES[data["tensor"]]
        raw = torch.frombuffer(bytearray(base64.b64decode(data["bytes"])), dtype=torch.uint8)
        flat = raw.to(torch.bool) if dtype == torch.bool else raw.view(dtype)
        return flat.reshape(data["shape"]).clone()
    if "seq" in data:
        items = [decode(item, args) for item in data["seq"]]
        return tuple(items) if data["tuple"] else items
    if "plain" in data:
        return data["plain"]
    return type(data["other"], (), {})()  # same type name, so "it is a <name>" messages read the same


def is_data(value) -> bool:
    """A tensor, a plain value, or a list or tuple of them: what a recording carries exactly."""
    if isinstance(value, (list, tuple)):
        return all(is_data(item) for item in value)
    return value is None or isinstance(value, (torch.Tensor, bool, int, float, str))


def record_call(name: str, args: tuple, result) -> dict:
    """What one call of the learner's ``name`` left behind: its result and its tensor arguments."""
    return {"call": name, "result": encode(result, args),
            "args_after": [encode(arg) if isinstance(arg, torch.Tensor) else None for arg in args]}


# -- the replaying side --------------------------------------------------------------------------------

class ReplayContext:
    """What a check's ``run(ctx)`` sees in the replay: the same rank and world, answers from the recording."""

    def __init__(self, rank: int, world: int, recording: list):
        self.rank, self.world = rank, world
        self._events = list(recording)

    def _next(self, kind: str) -> dict:
        if not self._events or kind not in self._events[0]:
            raise NotReplayable(f"the check asked for {kind!r} where the recording has "
                                f"{next(iter(self._events[0]), 'nothing') if self._events else 'nothing left'}")
        return self._events.pop(0)

    def call(self, name: str, *args, **kwargs):
        event = self._next("call")
        if event["call"] != name:
            raise NotReplayable(f"the check called {name!r} where the rank called {event['call']!r}")
        for arg, after in zip(args, event["args_after"]):
            if after is not None and isinstance(arg, torch.Tensor):
                value = decode(after)
                if value.shape == arg.shape and value.dtype == arg.dtype:
                    arg.copy_(value)
        return decode(event["result"], args)

    def sent_elements(self) -> int:
        return self._next("sent")["sent"]

    def all_gather(self, tensor: torch.Tensor) -> list:
        return decode(self._next("gathered")["gathered"])

    def learner(self, name: str):
        raise NotReplayable("the check hands the learner's object out; it cannot be replayed from a recording")

    def allow(self):
        raise NotReplayable("the check communicates on its own; it cannot be replayed from a recording")

    def running_learner_code(self):
        raise NotReplayable("the check runs learner code directly; it cannot be replayed from a recording")

    def fail(self, message: str):
        from .spec import Fail
        raise Fail(message)


def judge(exercise_id: str, index: int, rank: int, world: int, recording: list) -> dict:
    """Run check ``index`` of the exercise again from ``recording``; its outcome and message."""
    from .spec import Fail, get_exercise
    check = get_exercise(exercise_id).checks[index]
    with torch.random.fork_rng():
        torch.manual_seed(1000 + rank)  # as the rank did before the check (rank.py)
        try:
            check.run(ReplayContext(rank, world, recording))
            return {"outcome": "passed", "message": ""}
        except Fail as failure:
            return {"outcome": "failed", "message": str(failure), **({"hint": failure.hint} if failure.hint else {})}
        except NotReplayable as problem:
            return {"outcome": "not_replayable", "message": str(problem)}


class Judge:
    """The clean process that replays checks: started early (importing torch overlaps the ranks' start),
    asked once, at the end, about every recorded check."""

    def __init__(self):
        import os
        import subprocess
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "DPTEACH_GPUS": "0"}
        self.process = subprocess.Popen([sys.executable, "-m", "dpteach.grading.replay"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    def verdicts(self, requests: list[dict], timeout: float = 120.0) -> dict:
        """``{request key: verdict}``; raises RuntimeError (with the judge's last words) if it fails."""
        import subprocess
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


def rejudge(exercise_id: str, finished: dict, judge: "Judge | None") -> None:
    """Give every recorded rank result of ``finished`` (``{(job, check): {rank: record}}``) the verdict
    the clean process reaches; a rank whose own verdict was kinder is marked ``tampered``."""
    requests = [{"key": f"{job}/{index}/{rank}", "exercise": exercise_id, "check": index, "rank": rank,
                 "world": len(per_rank), "recording": record["recording"]}
                for (job, index), per_rank in finished.items() for rank, record in per_rank.items()
                if "recording" in record and record["outcome"] in ("passed", "failed")]  # not what the seal broke
    if not requests:
        return
    try:
        verdicts = judge.verdicts(requests) if judge is not None else {}
    except RuntimeError as problem:
        verdicts, unconfirmed = {}, str(problem)
    else:
        unconfirmed = "no judging process"
    for request in requests:
        job, index, rank = (int(part) for part in request["key"].split("/"))
        record = finished[(job, index)][rank]
        verdict = verdicts.get(request["key"])
        if verdict is None or verdict["outcome"] not in ("passed", "failed"):
            reason = verdict["message"] if verdict else unconfirmed
            record["message"] = (record["message"] + "\n" if record["message"] else "") + (
                f"(this verdict could not be confirmed outside the ranks: {reason})")
        elif record["outcome"] == "passed" and verdict["outcome"] == "failed":
            record.pop("hint", None)
            record.update(outcome="tampered", message=(
                "inside your ranks this check passed, but judged again outside them, with a torch your code "
                "never touched, it fails: " + verdict["message"] + ". Your code changed how its own process "
                "compares results"))
        else:
            record.pop("hint", None)
            record.update(verdict)


def main() -> None:
    """Read one request per line on stdin, write one verdict per line on stdout."""
    for line in sys.stdin:
        request = json.loads(line)
        try:
            verdict = judge(request["exercise"], request["check"], request["rank"], request["world"],
                            request["recording"])
        except Exception as exc:  # the grader's own problem: reported, never silently passed
            verdict = {"outcome": "grader_error", "message": f"{type(exc).__name__}: {exc}"}
        print(json.dumps({"key": request["key"], **verdict}), flush=True)


if __name__ == "__main__":
    main()
