"""One function per lesson: each runs real ranks and returns plain data (dicts and lists).

Notebooks, widgets, the command line and the tests all call these, so a number printed in a
notebook and a number asserted in a test come from the same code.

Which function lives in which module is written once, in the course table (``dpteach.course``);
``from dpteach.experiments import overlap_timeline`` imports ``overlap.py`` on first use, so a lesson
loads its own experiments and not the whole course's.
"""
from importlib import import_module

from ..course import experiment_homes

_HOMES = experiment_homes()
__all__ = list(_HOMES)


def __getattr__(name: str):
    module = _HOMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value  # the next look-up is an ordinary one
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
