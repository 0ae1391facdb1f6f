"""How a check reaches the learner's code inside a rank: the context a check's ``run(ctx)`` is given.

Everything a check learns from outside itself goes through the context, and the context records it for
the replay outside the ranks (``replay.py``): what each call of the learner's code returned and left in
its arguments, what each drive observed, the traffic counts and what the rank put into the grader's own
all-gathers.
The recording is not optional: a check that passed in its rank counts only once it passed again from its
recording (``judge.py``). ``replayable`` says whether the check stayed within what a recording can carry;
a check that reaches for live objects outside a drive loses it - and with it any chance to pass.

Each return from the learner's code is a *checkpoint*: before anything it returned is judged or recorded,
the seal is compared (``seal.py``) and the audit hook's notes read (``tampering.py``); if the learner's
code replaced a tool, left a torch mode active or reached into the grader's frames, the check stops there
with :class:`Tampered`.

**Salts.** The data of a check with several ranks is drawn from each rank's own secret salt
(:meth:`Context.secret_seed`), never from the seed alone: the seeds of the checks are public - they are in
the check modules - and a learner who could rebuild every rank's data from them would need no messages at
all. The parent chose the salts (``salts.py``); this rank can derive only its own. In the rank, the check
learns the other ranks' seeds with its own all-gather, after the learner's call has returned; that verdict
is only a first opinion: the judge derives every rank's salts from the parent's keys, so neither the salts
nor the seeds nor the grader's all-gathers are recorded or taken from the rank.
"""
from __future__ import annotations

import traceback
from contextlib import contextmanager

import torch
import torch.distributed as dist

from . import salts as _salts
from .guard import ForbiddenCall, Guard, Handed
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

    def __init__(self, rank: int, world: int, namespace: dict, guard: Guard, learner_files, checkpoint=None,
                 salt=None):
        self.rank, self.world = rank, world
        if salt is None:  # outside a graded rank (tests): a key of its own
            key = _salts.new_keys(1)[0]
            salt = lambda draw: _salts.salt(key, 0, 0, draw)  # noqa: E731
        self._salt, self._draws = salt, 0  # this rank's salts only: see salts.py
        self.counts_traffic = guard.traffic.counts  # decided by the parent: dpteach/network/traffic.py
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

    def secret_seed(self, seed: int) -> int:
        """This rank's seed for a case: the public ``seed`` mixed with its next secret salt (the seed itself in
        a world of one, where nothing is secret). Not recorded: the judge derives it from the parent's keys."""
        draw, self._draws = self._draws, self._draws + 1
        return seed if self.world == 1 else _salts.mixed(seed, self._salt(draw))

    def everyones(self, mine: int) -> list[int]:
        """Every rank's seed (``mine``: this rank's, from :meth:`secret_seed`), by the grader's own all-gather -
        for the rank's own verdict only; the judge computes them from the parent's keys (``replay.py``)."""
        if self.world == 1:
            return [mine]
        gathered = [torch.empty(1, dtype=torch.int64) for _ in range(self.world)]
        with self.guard.allow():
            dist.all_gather(gathered, torch.tensor([mine], dtype=torch.int64))
        seeds = [int(part.item()) for part in gathered]
        if seeds[self.rank] != mine:
            raise Tampered("the grader's own all-gather came back with another seed for this rank than it sent")
        return seeds

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
        """The grader's own all-gather (never counted as the learner's traffic). Only what this rank put in is
        recorded: the judge hands each rank what its peers recorded putting in, never what a rank received."""
        gathered = [torch.empty_like(tensor) for _ in range(self.world)]
        with self.guard.allow():
            dist.all_gather(gathered, tensor)
        self._record({"gather": encode(tensor)})
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

    def handed(self, function) -> Handed:
        """``function`` handed to the learner's code as a callable it may call and not look inside (see
        ``guard.Handed``); it must hold nothing of the check's (not this context, no counter)."""
        self.guard.hand(function)
        return Handed(function)

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
