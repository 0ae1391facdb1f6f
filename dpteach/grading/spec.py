"""What an exercise is, for the grader: the names the learner writes, the stub they start from, the checks.

An :class:`Exercise` is plain data. Each exercise module in ``dpteach/grading/checks/`` builds one: the
runner runs its checks on real ranks, and the report lists them in the order they are declared here.
It holds only what the grader needs. What the exercise says to people - the intro, the cell that tries
the code, what to do next - is written in its notebook, ``exercises/NN_*.ipynb``, and nowhere else. The
one thing the notebook takes from here is the stub: ``exercises/build.py`` writes ``Exercise.stub`` into
the notebook's cell tagged ``solution``, so that cell is, character for character, the stub the grader
compares the learner's cell against to tell "not attempted" from an attempt.

A :class:`Check` is one property with points. Its ``run(ctx)`` executes on *every* rank of a world of
``world`` ranks, calls the learner's code through ``ctx`` (see ``dpteach/grading/in_rank.py``) and raises
:class:`Fail` with a message for people when the property does not hold. Messages describe what is
wrong ("the chunk's values differ from the sum over ranks") and never the expected numbers: an
answer key leaked through an error message is still an answer key.
"""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

# The exercise modules, in course order: the modules of ``checks/`` named ``exNN_*`` that define
# ``EXERCISE`` (their helpers, such as ``ex04_steps``, define none). A new exercise is a new module.
CHECKS_DIR = Path(__file__).with_name("checks")
EXERCISE_MODULES = tuple(f"{__package__}.checks.{path.stem}" for path in sorted(CHECKS_DIR.glob("ex[0-9][0-9]_*.py"))
                         if "\nEXERCISE = " in path.read_text(encoding="utf-8"))

# Every stub function's body is ``raise NotImplementedError("your code here")``; this text in a code
# object's constants marks a stub when its source cannot be found (see notebook.attempted).
STUB_TEXT = "your code here"

# Collectives that a "build it yourself" exercise may not call, read from torch itself rather than listed
# by hand: a list written for one torch release misses what the next one adds (torch 2.13 added
# dist.reduce_scatter_single and dist.all_gather_single, which a hand-written list did not name).
# Point-to-point messages - one tensor to or from one named peer - are what the exercises are built
# from, so they are never forbidden; these are the ProcessGroup's point-to-point primitives.
POINT_TO_POINT_METHODS = ("send", "recv", "recv_anysource")


def _signatures(function) -> list[str]:
    """The signature lines of a pybind11 function's docstring (one per overload): ``name(args) -> result``."""
    name = getattr(function, "__name__", "")
    return [line.strip().split(". ", 1)[-1] for line in (getattr(function, "__doc__", None) or "").splitlines()
            if re.match(rf"^(\d+\. )?{re.escape(name)}\(", line.strip())]


def process_group_collectives(group_class=None) -> tuple[str, ...]:
    """The ProcessGroup methods that start a collective (``dist.group.WORLD.allreduce(...)``): those that take
    tensors and return a Work, other than the point-to-point ones. A barrier takes no tensor: it moves no
    data, so it cannot stand in for anything an exercise asks for, and it stays allowed."""
    if group_class is None:
        import torch
        group_class = torch._C._distributed_c10d.ProcessGroup
    found = []
    for name in sorted(vars(group_class)):
        lines = _signatures(getattr(group_class, name)) if not name.startswith("__") else []
        if name not in POINT_TO_POINT_METHODS and any(
                "Tensor" in line.rsplit("->", 1)[0] and "Work" in line.rsplit("->", 1)[-1] for line in lines):
            found.append(name)
    return tuple(found)


def torch_collectives(module=None, methods=None) -> tuple[str, ...]:
    """Dotted names of the functions in ``torch.distributed`` that run a collective.

    A Python function of ``distributed_c10d`` is one when its code calls a collective ProcessGroup method
    (``all_reduce`` calls ``allreduce``), or calls another such function (``all_gather_object`` calls
    ``all_gather``); a context manager (``_coalescing_manager``, which ``batch_isend_irecv`` uses for
    point-to-point messages too) runs whatever is called inside it, and that is judged on its own. A C
    function is one when it takes a ProcessGroup and tensors (``_broadcast_coalesced``).
    """
    import inspect
    import warnings
    if module is None:
        import torch.distributed as module
    methods = set(process_group_collectives() if methods is None else methods)
    c10d = getattr(module, "distributed_c10d", module).__name__
    names, calls = set(), {}
    for name in sorted(dir(module)):
        with warnings.catch_warnings():  # deprecated aliases (dist.reduce_op) warn when touched
            warnings.simplefilter("ignore")
            value = getattr(module, name, None)
            if value is None or inspect.isclass(value) or not callable(value):
                continue
        code_of = inspect.unwrap(value)
        if inspect.isfunction(code_of):
            if code_of.__module__ == c10d and not inspect.isgeneratorfunction(code_of):
                calls[name] = set(code_of.__code__.co_names)
        elif any("ProcessGroup" in line and "Tensor" in line for line in _signatures(value)):
            names.add(name)
    grown = True
    while grown:
        reached = {name for name, called in calls.items() if called & (methods | names)} - names
        names |= reached
        grown = bool(reached)
    return tuple(f"torch.distributed.{name}" for name in sorted(names))


PROCESS_GROUP_METHODS = process_group_collectives()
TORCH_COLLECTIVES = torch_collectives(methods=PROCESS_GROUP_METHODS)
# What an exercise that forbids all-reduce only (08, 09: reduce-scatter and all-gather are the point) forbids.
TORCH_ALL_REDUCES = tuple(name for name in TORCH_COLLECTIVES if "all_reduce" in name)
PROCESS_GROUP_ALL_REDUCES = tuple(name for name in PROCESS_GROUP_METHODS if "allreduce" in name)
DPTEACH_COLLECTIVES = tuple(f"dpteach.collectives.{name}" for name in (
    "ring_all_reduce", "ring_reduce_scatter", "ring_all_gather", "tree_all_reduce", "naive_all_reduce"))
# Whole modules that are collectives under another name.
COLLECTIVE_MODULES = ("torch.distributed._functional_collectives", "torch.distributed.nn")
ALL_COLLECTIVES = TORCH_COLLECTIVES + DPTEACH_COLLECTIVES


def no_collectives(*also: str) -> dict:
    """An exercise's rule when the learner builds on point-to-point messages (or leaves the communication to
    DDP): no collective of torch's or of the course's, by name, by process-group method or by module;
    ``also``: more qualified names. Pass it as ``Exercise(..., **no_collectives(...))``."""
    return {"forbidden": ALL_COLLECTIVES + also, "forbidden_methods": PROCESS_GROUP_METHODS,
            "forbidden_modules": COLLECTIVE_MODULES}


class Fail(Exception):
    """A checked property does not hold; the message says which, in words, without expected values.

    ``hint``, when given, is the hint for *this* failure and replaces the check's own: a check that can
    fail in several ways (wrong chunks, nothing written back, too much traffic) points each at its cause.
    """

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


@dataclass(frozen=True)
class Check:
    """One property with points, checked on ``world`` real ranks.

    ``uses`` names the learner's functions the check calls: when one of them hangs, the world has to be
    killed, and later checks of the same function are skipped rather than each waiting for its own
    time-out (the learner fixes the hang first either way). Left empty, it is every name the exercise
    defines (``Exercise.names``). ``hint`` is shown when the check fails.

    Every check is judged twice: in the ranks, and again by ``replay.py`` in a clean process from what the
    rank recorded, and only a check passed in both passes. So a check talks to the learner only through
    its context (``learner.py``): ``ctx.call`` for a function given and returning data, ``ctx.drive`` for
    what needs live objects (a model, an optimizer) and returns what it observed, ``ctx.secret_seed``,
    ``ctx.everyones``, ``ctx.all_gather`` and ``ctx.sent_elements`` for the rest - and it computes what it
    expects only after the learner's call has returned, from data the learner never held (other ranks'
    secret salts, which the judge derives from the parent's keys: ``salts.py``).
    """

    name: str
    points: int
    world: int
    run: Callable
    hidden: bool = False
    uses: tuple = ()
    hint: str = ""
    limit: float = 6.0

    HIDDEN = "hidden: "  # how a hidden check's name starts in every report; the flag alone decides it

    def __post_init__(self):
        if self.hidden and not self.name.startswith(self.HIDDEN):
            object.__setattr__(self, "name", self.HIDDEN + self.name)  # frozen: set once, here
        if not self.hidden and self.name.startswith(self.HIDDEN):
            raise ValueError(f"name={self.name!r}: a check is hidden by hidden=True, not by its name")


# Functions that run in a rank after the learner's code and whose results the replay takes as observed
# (the drives of ``ctx.drive`` and the helpers that read what they return): the seal pictures their code.
OBSERVERS: list = []


def observes(function):
    """Mark ``function`` as one whose results are recorded as observations (see ``OBSERVERS``)."""
    OBSERVERS.append(function)
    return function


@dataclass(frozen=True)
class Exercise:
    """One exercise as the grader sees it: the names the learner defines, the stub, the checks, the rules.
    (Its text for people is in its notebook, ``exercises/`` + :attr:`notebook_name`.)"""

    id: str                   # "01"
    stem: str                 # notebook file name without .ipynb; also the progress-store key
    title: str
    names: tuple              # what the learner defines (functions or classes)
    stub: str                 # the solution cell exactly as it ships
    checks: tuple
    forbidden: tuple = ()     # qualified names (see ALL_COLLECTIVES) the learner's code may not use
    forbidden_methods: tuple = ()  # ProcessGroup method names, likewise
    forbidden_modules: tuple = ()
    rule: str = ""            # one sentence: what the forbidden list means, shown when it is broken
    warmup: Callable | None = None  # run in each rank before the first check, outside its time limit
    hint: str = ""            # the hint of every check that gives none of its own

    def __post_init__(self):  # a check that names no function calls every one the learner defines
        object.__setattr__(self, "checks", tuple(
            replace(check, uses=check.uses or tuple(self.names), hint=check.hint or self.hint)
            for check in self.checks))

    @property
    def max_score(self) -> int:
        return sum(check.points for check in self.checks)

    @property
    def notebook_name(self) -> str:
        return f"{self.stem}.ipynb"


def all_exercises() -> list[Exercise]:
    """Every exercise, in course order (imports the exercise modules on first use)."""
    return [importlib.import_module(name).EXERCISE for name in EXERCISE_MODULES]


def get_exercise(key: str) -> Exercise:
    """An exercise by id ("01", "1"), notebook stem ("01_ring_all_reduce"...) or notebook file name."""
    text = str(key).strip()
    if text.endswith(".ipynb"):
        text = text[:-len(".ipynb")]
    if text.isdigit():  # by id: import that exercise's module only (ranks look exercises up this way)
        for name in EXERCISE_MODULES:
            if int(name.rsplit(".", 1)[1][2:4]) == int(text):
                return importlib.import_module(name).EXERCISE
    exercises = all_exercises()
    for exercise in exercises:
        if text in (exercise.id, exercise.stem) or (text.isdigit() and int(text) == int(exercise.id)):
            return exercise
    known = ", ".join(f"{e.id} ({e.stem})" for e in exercises)
    raise ValueError(f"exercise={key!r} is not an exercise of this course; choose one of: {known}")
