"""How a check reaches the learner's code inside a rank: the context a check's ``run(ctx)`` is given.

Everything a check learns from outside itself goes through the context, and the context records it for
the replay outside the ranks (``replay.py``): what each call of the learner's code returned and left in
its arguments, what each drive observed, the salts, the traffic counts and the grader's own all-gathers.
The recording is not optional: a check that passed in its rank counts only once it passed again from its
recording (``judge.py``). ``replayable`` says whether the check stayed within what a recording can carry;
a check that reaches for live objects outside a drive loses it - and with it any chance to pass.

Each return from the learner's code is a *checkpoint*: before anything it returned is judged or recorded,
the seal is compared (``seal.py``) and the audit hook's notes read (``tampering.py``); if the learner's
code replaced a tool, left a torch mode active or reached into the grader's frames, the check stops there
with :class:`Tampered`.

**Salts.** The data of a check with several ranks is drawn from each rank's own secret salt
(:meth:`Context.salt`, from the operating system's randomness), never from the seed alone: the seeds of
the checks are public - they are in the check modules - and a learner who could rebuild every rank's data
from them would need no messages at all. The check learns the other ranks' salts with its own all-gather,
after the learner's call has returned, and only then computes what it expects.
"""
from __future__ import annotations

import secrets
import traceback
from contextlib import contextmanager

import torch
import torch.distributed as dist

from .guard import ForbiddenCall, Guard
from .replay import Decoder, Encoder, drive_name, encode, is_data, record_call
from .spec import Fail


class Tampered(BaseException):
    """The learner's code changed the tools a check judges with; the message says what."""


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
    """What a check's ``run(ctx)`` sees: its rank and world, and safe ways to reach the learner's code.

    ``checkpoint``, when given, is called each time the learner's code returns and raises Tampered when
    it finds tampering (the rank passes the seal's and the audit hook's; tests may leave it out).
    """

    def __init__(self, rank: int, world: int, namespace: dict, guard: Guard, learner_files, checkpoint=None):
        self.rank, self.world = rank, world
        self.namespace, self.guard, self.learner_files = namespace, guard, learner_files
        self.recording: list[dict] = []  # what the replay outside the ranks needs (replay.py)
        self.replayable = True  # False once the check reached for what a recording cannot carry
        self._checkpoint = checkpoint
        self._driving = 0

    def _record(self, event: dict) -> None:
        if not self._driving:  # inside a drive, the drive's result is the record
            self.recording.append(event)

    def call(self, name: str, *args, **kwargs):
        """Run the learner's ``name(*args, **kwargs)`` with the guard watching; record what it left, and
        return the recorded result: the rank judges the very values the replay will judge."""
        if not all(is_data(value) for value in (*args, *kwargs.values())):
            if not self._driving:
                self.replayable = False
            with self._watched():
                return self.namespace[name](*args, **kwargs)
        with self._watched():
            result = self.namespace[name](*args, **kwargs)
        event = record_call(name, args, result)
        self._record(event)
        return Decoder(event["blobs"], args).value(event["result"])

    def drive(self, function, *args):
        """Run ``function(ctx, *args)`` - grader code that works the learner's live objects - in the rank
        only; its result (data) is recorded, and the replay takes it from the recording instead. The
        rank judges the recorded copy too, so both verdicts rest on the same values."""
        self._driving += 1
        try:
            value = function(self, *args)
        finally:
            self._driving -= 1
        self.check_tools()
        encoder = Encoder()
        event = {"drive": drive_name(function), "value": encoder.value(value), "blobs": encoder.blobs}
        self._record(event)
        return Decoder(event["blobs"]).value(event["value"])

    def salt(self) -> int:
        """A secret of this rank's for this check (0 in a world of one, where nothing is secret)."""
        if self.world == 1:
            return 0
        value = secrets.randbits(62)
        self._record({"salt": value})
        return value

    def sent_elements(self) -> int:
        """Elements this rank's learner code has sent so far (the guard's count), recorded for the replay."""
        count = self.guard.sent_elements
        self._record({"sent": count})
        return count

    def received_bytes(self):
        """Bytes that reached this rank through the check's process group (None where they cannot be
        counted: ``guard.Traffic``). Not recorded: call it inside a drive and return what it says."""
        return self.guard.traffic.received()

    def all_gather(self, tensor: torch.Tensor) -> list:
        """The grader's own all-gather (never counted as the learner's traffic), recorded for the replay."""
        gathered = [torch.empty_like(tensor) for _ in range(self.world)]
        with self.guard.allow():
            dist.all_gather(gathered, tensor)
        self._record({"gathered": encode(gathered)})
        return gathered

    def learner(self, name: str):
        if not self._driving:
            self.replayable = False
        return self.namespace[name]

    def hand(self, function):
        """``function`` - grader code - may be called from the learner's code (a hook DDP calls, a callback
        handed over); any other call of the grader's code from the learner's is tampering (``guard.py``)."""
        self.guard.hand(function)
        return function

    def running_learner_code(self):
        """Everything inside is the learner's doing: watched, and its exceptions become LearnerError."""
        if not self._driving:
            self.replayable = False
        return self._watched()

    def check_tools(self) -> None:
        if self._checkpoint is not None:
            self._checkpoint()

    @contextmanager
    def _watched(self):
        try:
            with self.guard.watching():
                try:
                    yield
                except (Fail, ForbiddenCall, Tampered):
                    raise
                except BaseException as exc:  # SystemExit and KeyboardInterrupt from their code, too
                    raise LearnerError(trimmed_traceback(exc, self.learner_files), type(exc).__name__) from None
        finally:
            self.check_tools()  # a Tampered from here replaces whatever the learner's code raised

    def allow(self):
        """The grader's own communication inside a learner window (see ``Guard.allow``)."""
        if not self._driving:
            self.replayable = False
        return self.guard.allow()

    def fail(self, message: str):
        raise Fail(message)
