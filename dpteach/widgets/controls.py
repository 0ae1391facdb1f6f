"""Controls whose readout is exactly the value the experiment receives.

``ipywidgets.FloatLogSlider`` moves in steps of the exponent, so its values are powers like 10**2.3 =
199.53; the readout rounds them to "200" while the experiment gets 199.53 (and a model of "7B"
parameters was 7.08B). ``log_slider`` offers round values instead - 1, 1.5, 2, 3, 5, 7 in every decade -
on a ``SelectionSlider``, whose label is the value itself.
"""
from __future__ import annotations

import math

import ipywidgets as widgets

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
    """A slider over the round values between ``low`` and ``high``, starting at the one nearest ``value``."""
    values = round_values(low, high)
    start = min(values, key=lambda v: abs(math.log(v) - math.log(value)))
    return widgets.SelectionSlider(options=[(_label(v), v) for v in values], value=start, description=description,
                                   continuous_update=False, style={"description_width": "initial"})
