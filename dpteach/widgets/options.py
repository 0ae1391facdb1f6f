"""Every choice a panel offers, run: the check that no option of a lesson is a dead end.

A panel's dropdowns and checkboxes are promises: pick this model, this link, this optimizer, and the
run works. :func:`run_every_option` keeps them - for every panel a notebook built, it runs rounds in
which round k puts every dropdown on its k-th option (a checkbox counts as two options), so that each
option of each control runs at least once, with the sliders at their cheapest (their minimum, a
panel's fixed number of steps cut to three, and a sweep over world sizes cut to the lesson's first two). A
combination the course refuses by design is not a dead end, and the rounds avoid the one there is:
emulated peers with no link to time them (that round takes real ranks, and emulated peers get a round
with a link). A multiple selection (the sizes, algorithms or world sizes a panel runs side by side) gets one
round of its own that runs every option the lesson's own selection leaves out, beside the first it holds (the
baseline some experiments require, such as W = 1 in a scaling sweep). A round with exactly the values of a run
the panel already finished without error - the lesson's own run, at its defaults - is not run a second time.

The test suite runs it at the end of every lesson, in the kernel that ran the lesson
(``tests/test_notebook_clients.py``).
"""
from __future__ import annotations

import time

import ipywidgets as widgets

from ..front_end import widgets_only

CHOICES = (widgets.Dropdown, widgets.ToggleButtons, widgets.RadioButtons, widgets.Select)
FEWEST_STEPS = 3  # every experiment that trains accepts 3 steps (prefetching and timing need 2 or 3)
FEWEST_WORLD_SIZES = 2  # a sweep over W keeps its first two sizes: still a trend, and no W=4 on 2 cores


def choices_of(control) -> list | None:
    """The values a control offers to choose between (None for a slider, a text box or a multiple selection)."""
    if isinstance(control, widgets.Checkbox):
        return [False, True]
    if isinstance(control, CHOICES):
        return _values(control)
    return None


def _values(control) -> list:
    return [option[1] if isinstance(option, tuple) else option for option in control.options]


def left_out_round(control) -> tuple | None:
    """A multiple selection's extra round: the first option its value holds and every option it leaves out, in
    the order offered; None when the value already holds every option."""
    offered, held = _values(control), tuple(control.value)
    left_out = [v for v in offered if v not in held]
    if not left_out:
        return None
    return tuple(v for v in offered if v in left_out or (held and v == held[0]))


def several_of(panel) -> dict:
    """The panel's multiple selections: ``{name: control}``."""
    return {name: c for name, c in panel.controls.items() if isinstance(c, widgets.SelectMultiple)}


def cheapest(control):
    """A slider's smallest setting: its minimum, or its first option for a selection slider."""
    if isinstance(control, widgets.SelectionSlider):
        option = control.options[0]
        return option[1] if isinstance(option, tuple) else option
    if hasattr(control, "min") and hasattr(control, "max"):
        return control.min
    return control.value


def rounds(panel) -> list[dict]:
    """The overrides of each round: every choice of every choosing control at least once."""
    choosing = {name: choices_of(c) for name, c in panel.controls.items() if choices_of(c) is not None}
    sliders = {name: cheapest(c) for name, c in panel.controls.items()
               if name not in choosing and isinstance(c, (widgets.IntSlider, widgets.FloatSlider,
                                                          widgets.SelectionSlider))}
    if isinstance(panel.fixed.get("steps"), int) and "steps" not in panel.controls:
        sliders["steps"] = min(panel.fixed["steps"], FEWEST_STEPS)  # the panel's own steps, cut to the fewest
    # the world sizes a panel runs (chosen or fixed), cut to the lesson's first two: every choice is still
    # tried on real ranks, without the widest world, which costs most where cores are few
    chosen = panel.controls.get("world_sizes")
    sizes = tuple(chosen.value) if isinstance(chosen, widgets.SelectMultiple) else panel.fixed.get("world_sizes")
    if isinstance(sizes, tuple) and len(sizes) > FEWEST_WORLD_SIZES:
        sliders["world_sizes"] = sizes[:FEWEST_WORLD_SIZES]
    extra = {name: left_out_round(c) for name, c in several_of(panel).items()}
    extra = {name: value for name, value in extra.items() if value is not None}
    if not choosing:
        return [{**sliders, name: value} for name, value in extra.items()]

    def sensible(values: dict) -> dict:
        if values.get("peers") == "emulated" and values.get("link", "given") is None:
            values["peers"] = "real"  # emulated peers need a link to time them: this round takes real ranks
        return values

    out = [sensible({**sliders, **{name: options[k % len(options)] for name, options in choosing.items()}})
           for k in range(max(len(v) for v in choosing.values()))]
    for name, options in choosing.items():  # a choice the rule above displaced gets a round of its own
        for value in options:
            if not any(values[name] == value for values in out):
                out.append({**out[0], name: value, **({"link": next(v for v in choosing["link"] if v is not None)}
                                                      if name == "peers" and "link" in choosing else {})})
    return out + [{**out[0], name: value} for name, value in extra.items()]


def run_every_option(panels) -> dict:
    """Run every round of every panel; return ``{"runs", "already_ran", "errors": [...], "covered": {panel:
    {control: [values]}}, "offered": {panel: {control: [values]}}, "took": [{"panel", "values", "seconds"}]}``
    (values as ``repr``; ``took``: each round run, with its wall time).

    A round whose values are exactly those of a run the panel has already finished without error (the lesson's
    own run, at its defaults) is not run again: that run is the proof, and ``already_ran`` counts them."""
    errors, covered, offered, runs, already_ran, took = [], {}, {}, 0, 0, []
    for panel in panels:
        seen, several = covered.setdefault(panel.title, {}), several_of(panel)
        offered[panel.title] = {name: [repr(v) for v in choices_of(c)] for name, c in panel.controls.items()
                                if choices_of(c) is not None}
        offered[panel.title].update({name: [repr(v) for v in _values(c)] for name, c in several.items()})
        done = [entry["values"] for entry in panel.history]  # runs that finished without error
        for values in done:  # what the lesson itself ran without error covers its options too
            _credit(seen, values, offered[panel.title], several)
        for values in rounds(panel):
            wanted = {**panel.values(), **values}
            if wanted in done:
                already_ran += 1
            else:
                started = time.perf_counter()
                with widgets_only():  # the sweep reads panel.result; it does not show every run
                    panel.run(**values)
                runs += 1
                took.append({"panel": panel.title, "values": {k: repr(v) for k, v in values.items()},
                             "seconds": round(time.perf_counter() - started, 2)})
                if panel.error is not None:
                    errors.append({"panel": panel.title, "values": {k: repr(v) for k, v in values.items()},
                                   "error": f"{type(panel.error).__name__}: {panel.error}"[:1500]})
                    continue
                done.append(wanted)
            _credit(seen, wanted, offered[panel.title], several)
    return {"runs": runs, "already_ran": already_ran, "errors": errors, "covered": covered, "offered": offered,
            "took": took}


def _credit(seen: dict, values: dict, offered: dict, several: dict) -> None:
    """Count ``values`` (a run's full set of control values) as covering each option it used."""
    for name, value in values.items():
        if name in offered:
            for one in (value if name in several else (value,)):
                if repr(one) not in seen.setdefault(name, []):
                    seen[name].append(repr(one))
