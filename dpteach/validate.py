"""Argument checks for the course's public entry points, in one voice.

A bad argument must fail before any process starts, with a message that names the argument, the
value it got and what is allowed - ``steps=0 is not allowed: it must be an integer >= 1`` - because
a wrong value that reaches the ranks fails far from its cause, or hangs them all. The checks are
called where a learner's values come in (the experiments, ``launch``, ``TrainConfig.check``, the
cost model, the command line), once per call; code inside a rank trusts what was checked there.

Each function returns the value it checked, so that a check can sit where the value is used::

    steps = validate.integer("steps", steps, low=1)
"""
from __future__ import annotations

import math
import numbers


def refusal(name: str, value, allowed: str) -> ValueError:
    """The error every check raises: ``name=value is not allowed: allowed`` (for checks of their own)."""
    return ValueError(f"{name}={value!r} is not allowed: {allowed}")


def _refuse(name: str, value, allowed: str):
    raise refusal(name, value, allowed)


def _bounds(low, high, above=None) -> str:
    if above is not None:
        return f"> {above}" + (f" and <= {high}" if high is not None else "")
    if low is not None and high is not None:
        return f"in {low}..{high}"
    if low is not None:
        return f">= {low}"
    return f"<= {high}" if high is not None else ""


def integer(name: str, value, low: int | None = None, high: int | None = None, why: str = "") -> int:
    """``value`` when it is an int (not a bool) within ``low..high`` (either may be None)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or \
            (low is not None and value < low) or (high is not None and value > high):
        _refuse(name, value, f"it must be an integer {_bounds(low, high)}".rstrip() + why)
    return int(value)


def number(name: str, value, low: float | None = None, above: float | None = None, high: float | None = None,
           unit: str = "a number", why: str = "") -> float:
    """``value`` when it is a finite real number (not a bool) >= ``low`` or > ``above``, and <= ``high``.

    ``unit`` names what the number counts ("seconds", "a learning rate"), so that the message reads
    "it must be seconds > 0".
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or \
            (low is not None and value < low) or (above is not None and not value > above) or \
            (high is not None and value > high):
        _refuse(name, value, f"it must be {unit} {_bounds(low, high, above)}".rstrip() + why)
    return float(value)


def optional(check, name: str, value, **limits):
    """None, or ``value`` checked by ``check`` (``validate.integer`` or ``validate.number``)."""
    return None if value is None else check(name, value, **limits)


def choice(name: str, value, allowed, why: str = ""):
    """``value`` when it is one of ``allowed``."""
    if value not in tuple(allowed):
        _refuse(name, value, f"choose one of {', '.join(map(str, allowed))}" + why)
    return value


def choices(name: str, values, allowed, at_least: int = 1) -> list:
    """``values`` as a list, when each is one of ``allowed`` and there are at least ``at_least``."""
    given = values
    values = [values] if isinstance(values, str) else list(values)
    if len(values) < at_least or any(v not in tuple(allowed) for v in values):
        how_many = "from" if at_least <= 1 else f"{at_least} or more of"
        _refuse(name, given, f"choose {how_many} {', '.join(map(str, allowed))}")
    return values


def ranks(world, low: int, why: str) -> None:
    """Refuse a world (``dpteach.ranks.world.World``) of fewer than ``low`` ranks, saying ``why`` it needs them
    (a world of emulated peers counts the ranks it stands for)."""
    size = getattr(world, "timed_size", world.size)
    if size < low:
        _refuse("world_size", size, f"{why}, so world_size >= {low}")
