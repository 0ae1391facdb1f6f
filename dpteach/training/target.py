"""Time to a target loss: the one measure that is fair to a method that sends less.

Bytes per step and seconds per step reward sending less; loss per step rewards sending everything
every step. What a practitioner pays for is the wall-clock time until the model is as good as it needs
to be, so lesson 14 (and ``dpteach compare``) reports for every method the steps, and the seconds of
its own measured steps, until its loss first reaches a target.

A training loss is measured on each step's own batch, so it is noisy: one lucky batch can dip below
any target. The curve compared with the target is therefore a running mean over the last ``window``
steps (fewer at the very start), the same window for every method. The default window is 8, one
synchronisation period of local SGD at H = 8, so a method that syncs every 8 steps is judged on
whole rounds.

The default target is read from a run that every method is trying to match: 1/4 of the way back from
its best smoothed loss towards where it started - deep enough that a method must really train to get
there, early enough on the curve that the data's noise floor does not decide who arrives.
"""
from __future__ import annotations

from .. import validate

WINDOW = 8
TARGET_FRACTION = 0.25  # of the way from the best smoothed loss back to the first


def smoothed(losses, window: int = WINDOW) -> list[float]:
    """The running mean of ``losses`` over the last ``window`` steps (over fewer at the start)."""
    validate.integer("window", window, low=1)
    out, total = [], 0.0
    for i, loss in enumerate(losses):
        total += loss
        if i >= window:
            total -= losses[i - window]
        out.append(total / min(i + 1, window))
    return out


def default_target(losses, window: int = WINDOW) -> float:
    """A target loss read from a reference curve (see the module's docstring)."""
    curve = smoothed(losses, window)
    best = min(curve)
    return best + TARGET_FRACTION * (curve[0] - best)


def steps_to_target(losses, target: float, window: int = WINDOW) -> int | None:
    """How many steps until the smoothed loss first reaches ``target``; None if it never does."""
    for i, loss in enumerate(smoothed(losses, window)):
        if loss <= target:
            return i + 1
    return None


def time_to_target(losses, step_times, target: float, window: int = WINDOW) -> float | None:
    """The seconds of those steps, as measured (``step_times[s]``: step s's wall-clock time)."""
    steps = steps_to_target(losses, target, window)
    return None if steps is None else float(sum(step_times[:steps]))


TARGET_RULE = (f"the reference's loss (running mean over {WINDOW} steps), {TARGET_FRACTION:g} of the way from its "
               f"best back to its first")
