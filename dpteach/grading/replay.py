"""The verdict, reached again where no learner code has run: record in the rank, replay in a clean process.

A check runs in a rank, next to the learner's code, and judges it with torch. Whatever the learner's code
did to that process can sway the comparison there; the seal (``seal.py``) and the audit hook
(``tampering.py``) notice the ways they know, not all. So the rank also *records* everything the check
learned from outside itself (``learner.py``):

* each ``ctx.call``: what the learner's function returned, and what each tensor argument held after it;
* each ``ctx.drive``: what a drive - grader code that works the learner's live objects (a model, an
  optimizer) - observed and returned;
* each traffic count (``ctx.sent_elements``) and what the rank put into each of the grader's all-gathers.

Salts, seeds and what a grader's all-gather brought are *not* taken from the rank: the judge derives every
rank's salts from the keys the parent made (``salts.py``), and answers an all-gather with what each peer
recorded putting in (after checking that this rank put in what the replayed check puts in).

Tensors are recorded with their storage: its bytes, read straight from memory (no torch operator a
learner could override runs), and each tensor's offset, shape and stride in it. So two results that were
views of one buffer are views of one buffer again in the replay, and a result that was a view of an
argument is a view of the replay's argument. Only plain tensors on the CPU are recorded as tensors; a
subclass is recorded by its type name, so it cannot answer the replay's questions its own way.

After the ranks finish, ``python -m dpteach.grading.replay`` - a process that imported torch and the
grader before any learner code ran, and nothing of the learner's - runs the same check function again
with a context that answers from the recording instead of calling the learner. The check draws the same
inputs, builds the same expected values with an untouched torch and reaches its own verdict. The check
passes only when both verdicts say so (``judge.py``); a replay that cannot follow the recording (the check
asks for what the rank never recorded, or the rank recorded more than the check asks for) means the
check ran otherwise in the rank, and counts against the attempt.
"""
from __future__ import annotations

import base64
import ctypes
import json
import sys

import torch

DTYPES = {str(dtype): dtype for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
                                          torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)}
PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
# Taken when the grader is imported, before any learner code (the seal watches these names, too).
_string_at, _b64encode, _b64decode = ctypes.string_at, base64.b64encode, base64.b64decode


class NotReplayable(Exception):
    """The check asked for something the recording cannot answer."""


def _plain(value) -> bool:
    return (type(value) in PLAIN_TENSORS and value.device.type == "cpu" and value.layout == torch.strided
            and str(value.dtype) in DTYPES)


def _storage_key(tensor) -> tuple:
    storage = tensor.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


class Encoder:
    """JSON-able data for the values of one event; tensors that share a storage share it in the data."""

    def __init__(self, args=()):
        self.args, self.blobs, self._where = args, [], {}
        for index, arg in enumerate(args):
            if _plain(arg):
                self._where.setdefault(_storage_key(arg), {"arg_storage": index})

    def blob(self, tensor) -> int:
        storage = tensor.untyped_storage()
        self.blobs.append(_b64encode(_string_at(storage.data_ptr(), storage.nbytes())).decode())
        return len(self.blobs) - 1

    def value(self, value):
        if isinstance(value, torch.Tensor):
            for index, arg in enumerate(self.args):
                if value is arg:
                    return {"arg": index}
            if not _plain(value):
                return {"other": f"{type(value).__name__} on {value.device}"}
            key = _storage_key(value)
            if key not in self._where:
                self._where[key] = {"storage": self.blob(value)}
            return {"tensor": str(value.dtype), "shape": list(value.shape), "stride": list(value.stride()),
                    "offset": value.storage_offset(), **self._where[key]}
        if isinstance(value, (list, tuple)):
            return {"seq": [self.value(item) for item in value], "tuple": isinstance(value, tuple)}
        if type(value) is dict and all(type(key) is str for key in value):
            return {"dict": {key: self.value(item) for key, item in value.items()}}
        if value is None or type(value) in (bool, int, float, str):
            return {"plain": value}
        return {"other": type(value).__name__}


class Decoder:
    """Values back from an event's data; ``args`` are the replay's own arguments, for views of them."""

    def __init__(self, blobs, args=()):
        self.blobs, self.args, self._storages = blobs, args, {}

    def storage(self, index: int):
        if index not in self._storages:
            raw = _b64decode(self.blobs[index])
            bytes_ = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
            self._storages[index] = bytes_.untyped_storage()
        return self._storages[index]

    def value(self, data):
        if "arg" in data:
            return self.args[data["arg"]]
        if "tensor" in data:
            storage = (self.args[data["arg_storage"]].untyped_storage() if "arg_storage" in data
                       else self.storage(data["storage"]))
            return torch.empty(0, dtype=DTYPES[data["tensor"]]).set_(storage, data["offset"], data["shape"],
                                                                     data["stride"])
        if "seq" in data:
            items = [self.value(item) for item in data["seq"]]
            return tuple(items) if data["tuple"] else items
        if "dict" in data:
            return {key: self.value(item) for key, item in data["dict"].items()}
        if "plain" in data:
            return data["plain"]
        return type(data["other"].split(" on ")[0], (), {})()  # same type name: "it is a <name>" reads the same

    def restore(self, tensor, index: int) -> None:
        """Write a recorded storage back into ``tensor``'s storage (what the learner's call left in it)."""
        target = torch.empty(0, dtype=torch.uint8).set_(tensor.untyped_storage())
        source = torch.empty(0, dtype=torch.uint8).set_(self.storage(index))
        if target.numel() != source.numel():
            raise NotReplayable("an argument's memory differs in size from the one recorded")
        target.copy_(source)


def encode(value, args=()) -> dict:
    """One value as data, with the storages it uses."""
    encoder = Encoder(args)
    return {"value": encoder.value(value), "blobs": encoder.blobs}


def decode(data, args=()):
    return Decoder(data["blobs"], args).value(data["value"])


def is_data(value) -> bool:
    """A plain tensor, a plain value, or a list or tuple of them: what a recording carries exactly."""
    if isinstance(value, (list, tuple)):
        return all(is_data(item) for item in value)
    return value is None or type(value) in (bool, int, float, str) or (
        isinstance(value, torch.Tensor) and _plain(value))


def record_call(name: str, args: tuple, result) -> dict:
    """What one call of the learner's ``name`` left behind: its result and its tensor arguments."""
    encoder = Encoder(args)
    after = [encoder.blob(arg) if _plain(arg) else None for arg in args]
    return {"call": name, "args_after": after, "result": encoder.value(result), "blobs": encoder.blobs}


def drive_name(function) -> str:
    return f"{function.__module__}.{function.__qualname__}"


# -- the replaying side --------------------------------------------------------------------------------

class ReplayContext:
    """What a check's ``run(ctx)`` sees in the replay: the same rank and world, answers from the recording."""

    replayable = True

    def __init__(self, rank: int, world: int, recording: list, keys=None, job: int = 0, check: int = 0,
                 gathers=None):
        self.rank, self.world = rank, world
        self._events = list(recording)
        self._keys, self._job, self._check = keys, job, check  # every rank's salt key: from the parent
        self._gathers = gathers or {}  # rank -> what it put into each grader all-gather, in order
        self._draws, self._seeds, self._gathered = 0, {}, 0

    def _next(self, kind: str) -> dict:
        if not self._events or kind not in self._events[0]:
            found = next(iter(self._events[0]), "nothing") if self._events else "nothing left"
            raise NotReplayable(f"the check asked for {kind!r} where the rank recorded {found!r}")
        return self._events.pop(0)

    def call(self, name: str, *args, **kwargs):
        event = self._next("call")
        if event["call"] != name:
            raise NotReplayable(f"the check called {name!r} where the rank called {event['call']!r}")
        decoder = Decoder(event["blobs"], args)
        for arg, after in zip(args, event["args_after"]):
            if after is not None and isinstance(arg, torch.Tensor):
                decoder.restore(arg, after)
        return decoder.value(event["result"])

    def drive(self, function, *args):
        event = self._next("drive")
        if event["drive"] != drive_name(function):
            raise NotReplayable(f"the check drove {drive_name(function)} where the rank drove {event['drive']}")
        return Decoder(event["blobs"]).value(event["value"])

    def _salt_of(self, rank: int, draw: int) -> int:
        from .salts import salt
        if not self._keys or len(self._keys) <= rank:
            raise NotReplayable("the judge was given no salt keys for this check")
        return salt(self._keys[rank], self._job, self._check, draw)

    def secret_seed(self, seed: int) -> int:
        from .salts import mixed
        draw, self._draws = self._draws, self._draws + 1
        if self.world == 1:
            return seed
        mine = mixed(seed, self._salt_of(self.rank, draw))
        self._seeds[mine] = draw
        return mine

    def everyones(self, mine: int) -> list[int]:
        from .salts import peers
        if self.world == 1:
            return [mine]
        draw = self._seeds.get(mine)
        if draw is None:
            raise NotReplayable("the check asked for every rank's seed of a seed it never drew")
        return peers(mine, self._salt_of(self.rank, draw), [self._salt_of(r, draw) for r in range(self.world)])

    def sent_elements(self) -> int:
        return self._next("sent")["sent"]

    def all_gather(self, tensor: torch.Tensor) -> list:
        put = decode(self._next("gather")["gather"])
        if not (_plain(put) and put.dtype == tensor.dtype and put.shape == tensor.shape and torch.equal(put, tensor)):
            raise NotReplayable("the rank put other data into the grader's all-gather than the check does")
        index, self._gathered = self._gathered, self._gathered + 1
        try:
            return [decode(self._gathers[str(r)][index]) for r in range(self.world)]
        except (KeyError, IndexError):
            raise NotReplayable("a peer recorded no part of the grader's all-gather") from None

    def learner(self, name: str):
        raise NotReplayable("the check reached for the learner's object outside a drive")

    def allow(self):
        raise NotReplayable("the check communicated on its own outside a drive")

    def running_learner_code(self):
        raise NotReplayable("the check ran learner code outside a call or a drive")

    def fail(self, message: str):
        from .spec import Fail
        raise Fail(message)

    def finish(self) -> None:
        if self._events:
            raise NotReplayable(f"the rank recorded {len(self._events)} more event(s) than the check asks for")


def judge(exercise_id: str, index: int, rank: int, world: int, recording: list, keys=None, job: int = 0,
          gathers=None) -> dict:
    """Run check ``index`` of the exercise again from ``recording``; its outcome and message. ``keys``: every
    rank's salt key (``salts.py``); ``gathers``: what each rank recorded putting into the grader's all-gathers."""
    from .spec import Fail, get_exercise
    check = get_exercise(exercise_id).checks[index]
    with torch.random.fork_rng():
        torch.manual_seed(1000 + rank)  # as the rank did before the check (in_rank.py)
        ctx = ReplayContext(rank, world, recording, keys, job, index, gathers)
        try:
            check.run(ctx)
            ctx.finish()
            return {"outcome": "passed", "message": ""}
        except Fail as failure:
            return {"outcome": "failed", "message": str(failure), **({"hint": failure.hint} if failure.hint else {})}
        except NotReplayable as problem:
            return {"outcome": "not_replayable", "message": str(problem)}


def main() -> None:
    """Read one request per line on stdin, write one verdict per line on stdout."""
    from .spec import all_exercises
    all_exercises()  # every check module imported now, before any rank has run learner code
    for line in sys.stdin:
        request = json.loads(line)
        try:
            verdict = judge(request["exercise"], request["check"], request["rank"], request["world"],
                            request["recording"], request.get("keys"), request.get("job", 0), request.get("gathers"))
        except Exception as exc:  # the grader's own problem: reported, never silently passed
            verdict = {"outcome": "grader_error", "message": f"{type(exc).__name__}: {exc}"}
        print(json.dumps({"key": request["key"], **verdict}), flush=True)


if __name__ == "__main__":
    main()
