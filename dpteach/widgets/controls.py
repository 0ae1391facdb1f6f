"""Controls whose readout is exactly the value the experiment receives.

``ipywidgets.FloatLogSlider`` moves in steps of the exponent, so its values are powers like 10**2.3 =
199.53; the readout rounds them to "200" while the experiment gets 199.53 (and a model of "7B"
parameters was 7.08B). ``log_slider`` offers round values instead - 1, 1.5, 2, 3, 5, 7 in every decade -
on a ``SelectionSlider``, whose label is the value itself.

A dropdown one of whose options means "none" or "the default" (``None``) has a trap of its own:
ipywidgets 8 reads ``value=None`` as "nothing selected", so the option could never be shown as chosen - the
dropdown looked empty, and picking the option sent nothing. And a list mixing ``(label, value)`` pairs
with plain values is not read as pairs at all: the pair became one option whose value was the tuple.
``choice`` makes every option a pair and lets ``None`` be a value like any other.
"""
from __future__ import annotations

import math

import ipywidgets as widgets
from traitlets import observe, validate

MANTISSAS = (1, 1.5, 2, 3, 5, 7)


def round_values(low: float, high: float) -> list[float]:
    """Every 1-1.5-2-3-5-7 value from ``low`` to ``high`` (both included when they are such values)."""
    if not (low > 0 and high >= low):
        raise ValueError(f"round_values needs 0 < low <= high, got low={low!r}, high={high!r}")
    values = []
    for exponent in range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1):
        for mantissa in MANTISSAS:
            value = float(f"{mantissa * 10.0 ** exponent:.6g}")
            if low * (1 - 1e-9) <= value <= high * (1 + 1e-9):
                values.append(value)
    return values


def _label(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:g}"


def log_slider(description: str, low: float, high: float, value: float) -> widgets.SelectionSlider:
    """A slider over the round values between ``low`` and ``high``, starting at ``value``, which must be one
    of them: a slider that silently started at the nearest one ran 70 where its lesson's text said 60."""
    values = round_values(low, high)
    start = next((v for v in values if math.isclose(v, value, rel_tol=1e-9)), None)
    if start is None:
        nearest = sorted(values, key=lambda v: abs(math.log(v) - math.log(value)))[:2] if value > 0 else values[:2]
        raise ValueError(f"value={value!r} is not allowed for the slider {description!r}: it must be one of its round "
                         f"values between {low:g} and {high:g} (1, 1.5, 2, 3, 5, 7 in every decade), e.g. "
                         f"{' or '.join(f'{v:g}' for v in sorted(nearest))}")
    return widgets.SelectionSlider(options=[(_label(v), v) for v in values], value=start, description=description,
                                   continuous_update=False, style={"description_width": "initial"})


class Choice(widgets.Dropdown):
    """A dropdown where ``None`` is an option's value (see the module's docstring), not "no selection"."""

    @validate("value")
    def _validate_value(self, proposal):
        if proposal.value is None and None in self._options_values:
            return None
        return super()._validate_value(proposal)

    @observe("value")
    def _propagate_value(self, change):
        if change.new is None and None in self._options_values:
            index = self._options_values.index(None)
            if self.index != index:
                self.index = index
            return
        super()._propagate_value(change)


def choice(options, value, description: str, **kwargs) -> Choice:
    """A dropdown of ``options`` - ``(label, value)`` pairs or plain values, mixed as they come - showing
    ``value`` as chosen, ``None`` included."""
    pairs = [option if isinstance(option, tuple) else (str(option), option) for option in options]
    control = Choice(options=pairs, description=description, **kwargs)
    control.value = value
    return control


def model_control(cpu_default: str, description: str = "model") -> widgets.Dropdown:
    """The model dropdown of a lesson that trains: "auto" first and chosen - the lesson's laptop model
    ``cpu_default`` on CPU ranks, a GPU-sized transformer on GPU ranks (``dpteach.replica.sizing``) - then every
    model that fits where this machine's ranks compute (the GPU-sized ones only where there is a GPU)."""
    from ..ranks.backend import visible_gpus
    from ..replica.models import model_names
    names = model_names() if visible_gpus() else model_names("cpu")
    auto = "auto (a GPU-sized transformer on GPU ranks)" if visible_gpus() else f"auto ({cpu_default} on CPU ranks)"
    return widgets.Dropdown(options=[(auto, "auto"), *[(n, n) for n in names]], value="auto",
                            description=description, style={"description_width": "initial"},
                            layout=widgets.Layout(width="360px"))


def peers_control(world: widgets.IntSlider | None = None, real_max: int = 4) -> widgets.Dropdown:
    """Real ranks, or one rank whose W-1 peers the link emulates (``dpteach.ranks.world``, ``peers="emulated"``).

    On a machine with exactly one GPU it starts on emulated peers: real ranks would take turns on the
    one GPU, while one rank with emulated peers shows the timing of W GPUs. The ranks slider ``world``
    (if given) reaches 8 with emulated peers, ``real_max`` with real ranks.
    """
    from ..ranks.backend import visible_gpus
    one_gpu = visible_gpus() == 1
    control = widgets.Dropdown(options=[("real ranks", "real"), ("1 rank + emulated peers (timing only)", "emulated")],
                               value="emulated" if one_gpu else "real", description="peers",
                               style={"description_width": "initial"}, layout=widgets.Layout(width="360px"))

    def follow(change=None):
        if world is None:
            return
        emulated = control.value == "emulated"
        world.max = max(8, world.value) if emulated else max(real_max, world.min)
        if emulated and one_gpu and change is None:
            world.value = 8
    control.observe(follow, names="value")
    follow()
    return control
