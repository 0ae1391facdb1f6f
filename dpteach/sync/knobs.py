"""A strategy's own options ("knobs"), declared in the strategy's file: name, type, default, what is allowed, help.

Most of a run is the same for every strategy: the model, the steps, the batch, the optimizer, the link. Some
options belong to one strategy only: PowerSGD's rank, how many local steps local SGD takes between averages,
DiLoCo's outer learning rate. Those live next to the code that reads them, as a tuple of :class:`Knob`::

    class LocalSGD(GradientSync):
        knobs = (Knob("sync_every", 8, "local steps between two averages of the weights", low=1),)

and everything else is read from that declaration: the trainer carries the values a run chose in
``TrainConfig.knobs`` (a dict), ``Strategy.settings`` checks them and fills in the defaults before any rank
starts, ``make_strategy`` hands them to the class as keyword arguments, and ``dpteach compare`` makes one
command-line flag per knob (``--sync-every``). Adding a strategy with an option is its own file plus one
line in ``STRATEGIES``; no other file learns its name. (torchtitan keeps its configuration the same way,
grouped per component, next to the component that reads it.)

Two strategies may share a knob by sharing its declaration (``diloco`` inherits ``sync_every`` from
``local_sgd``; ``powersgd_torch`` takes ``powersgd``'s): one flag then sets it for both.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import validate


@dataclass(frozen=True)
class Knob:
    """One option of one strategy. ``kind``: int, float or bool; ``low`` / ``high``: inclusive bounds and
    ``above``: an exclusive lower bound (numbers only); ``none_ok``: None is allowed (``help`` says what it
    means); ``why``: added to a refusal, when the bound has a reason worth knowing."""

    name: str
    default: object
    help: str
    kind: type = int
    low: float | None = None
    high: float | None = None
    above: float | None = None
    none_ok: bool = False
    why: str = ""

    @property
    def flag(self) -> str:
        """Its command-line flag: ``sync_every`` -> ``--sync-every``."""
        return "--" + self.name.replace("_", "-")

    def check(self, strategy: str, value):
        """``value`` if this knob allows it, else a ValueError naming the strategy, the knob, the value and
        what is allowed."""
        try:
            if value is None and self.none_ok:
                return None
            if self.kind is bool:
                if not isinstance(value, bool):
                    raise validate.refusal(self.name, value, "give True or False")
                return value
            if self.kind is int:
                return validate.integer(self.name, value, low=self.low, high=self.high,
                                        why=", or None" if self.none_ok else "")
            return validate.number(self.name, value, low=self.low, above=self.above, high=self.high)
        except ValueError as refused:
            why = f" ({self.why})" if self.why else ""
            raise ValueError(f"strategy={strategy!r}: {refused}{why}") from None


def settings(strategy: str, knobs: tuple, given) -> dict:
    """Every knob of ``strategy`` with its value for one run: the ``given`` ones checked, the others at their
    defaults. A name the strategy does not declare is refused, with the names it does."""
    if given is None:
        given = {}
    if not isinstance(given, dict):
        raise validate.refusal("knobs", given, "give a dict of a strategy's own options, e.g. {'sync_every': 8}")
    declared = {knob.name: knob for knob in knobs}
    for name in given:
        if name not in declared:
            takes = f"it takes {', '.join(declared)}" if declared else "it takes no knobs"
            raise ValueError(f"knobs={{{name!r}: {given[name]!r}}} is not allowed with strategy={strategy!r}: {takes}")
    return {name: knob.check(strategy, given.get(name, knob.default)) for name, knob in declared.items()}
