"""The lessons' controls show the value the experiment receives (dpteach/widgets/controls.py).

ipywidgets 8 reads a Dropdown's ``value=None`` as "nothing selected": an option meaning "none" or "the
default" could never show as chosen, and a list mixing ``(label, value)`` pairs with plain values made
the pair one option whose value was the tuple. ``choice`` is the dropdown that gets both right; the last
test holds every lesson to it.
"""
import json
import re
from pathlib import Path

import ipywidgets as widgets
import pytest

from dpteach.widgets.controls import Choice, choice
from dpteach.widgets.link import link_control

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_plain_ipywidgets_cannot_show_a_none_option_as_chosen():
    # the behaviour that choice exists for: if this starts failing, ipywidgets changed and choice may go
    plain = widgets.Dropdown(options=[("auto", None), ("8", 8)], value=None)
    assert plain.index is None and plain.label is None
    mixed = widgets.Dropdown(options=[("auto", None), 8], index=0)
    assert mixed.value == ("auto", None)


def test_choice_shows_none_as_chosen_and_hands_it_over():
    control = choice([("auto", None), 8, 16], None, "batch")
    assert (control.index, control.label, control.value) == (0, "auto", None)
    control.value = 16
    assert (control.index, control.label) == (2, "16")
    control.index = 0  # what the browser sends when the learner picks the first option again
    assert (control.label, control.value) == ("auto", None)
    control.value = 8
    control.value = None
    assert (control.index, control.label) == (0, "auto")


def test_the_link_dropdown_can_start_on_none():
    control = link_control(None)
    assert control.value is None and control.label.startswith("none") and isinstance(control, Choice)


def test_no_lesson_builds_a_plain_dropdown_with_a_none_option():
    offenders = []
    for path in NOTEBOOKS:
        for cell in json.loads(path.read_text())["cells"]:
            source = "".join(cell["source"])
            for match in re.finditer(r"widgets\.Dropdown\(options=\[(.*?)\]", source, re.S):
                if re.search(r",\s*None\)", match.group(1)):
                    offenders.append(f"{path.name}: {match.group(0)[:80]}")
    assert not offenders, "use dpteach.widgets.controls.choice for these:\n" + "\n".join(offenders)


def test_a_log_slider_refuses_a_start_that_is_not_one_of_its_values():
    from dpteach.widgets.controls import log_slider
    with pytest.raises(ValueError, match=r"value=60 is not allowed .*'checkpoint, s'.* 50 or 70"):
        log_slider("checkpoint, s", 1, 1000, 60)
    assert log_slider("checkpoint, s", 1, 1000, 70).value == 70


def test_a_panel_refuses_a_slider_whose_value_the_browser_would_move_and_runs_exactly_what_a_slider_shows():
    from dpteach.widgets.panel import ExperimentPanel
    with pytest.raises(ValueError, match=r"slow_ms=65 .* steps of 10 from 0.* 60 or 70"):
        ExperimentPanel("t", experiment=lambda slow_ms: slow_ms, render=lambda r: None,
                        controls={"slow_ms": widgets.FloatSlider(value=65, min=0, max=200, step=10)})
    panel = ExperimentPanel("t", experiment=lambda slow_ms, k: (slow_ms, k), render=lambda r: None,
                            controls={"slow_ms": widgets.FloatSlider(value=60, min=0, max=200, step=10),
                                      "k": widgets.IntSlider(value=4, min=1, max=8)})
    assert panel.run() == (60.0, 4)


def test_every_lesson_shows_its_panel_before_it_runs_it():
    """A panel run before it is displayed shows nothing until the run ends: the learner waits blind."""
    offenders = []
    for path in NOTEBOOKS:
        for index, cell in enumerate(json.loads(path.read_text())["cells"]):
            source = "".join(cell["source"])
            for match in re.finditer(r"(\w+)\.run\(", source):
                shown = source.find(f"display({match.group(1)})")
                if shown < 0 or shown > match.start():
                    offenders.append(f"{path.name} cell {index}: {match.group(1)}.run() before display({match.group(1)})")
    assert not offenders, "\n".join(offenders)


def test_the_option_sweep_runs_every_option_of_a_multiple_selection_and_counts_only_what_ran():
    from dpteach.widgets.options import run_every_option
    from dpteach.widgets.panel import ExperimentPanel
    ran = []

    def experiment(world_sizes, link=None):
        if 1 not in world_sizes:
            raise ValueError("include 1")  # a baseline the experiment needs: the extra round keeps it
        ran.append((tuple(world_sizes), link))
        return world_sizes

    panel = ExperimentPanel("sweep", experiment=experiment, render=lambda r: None,
                            controls={"world_sizes": widgets.SelectMultiple(options=[1, 2, 3, 8], value=(1, 2)),
                                      "link": widgets.Dropdown(options=["a", "b"], value="a")})
    panel.run()
    report = run_every_option([panel])
    assert report["errors"] == []
    assert ((1, 3, 8), "a") in ran  # the options the lesson's selection left out, beside its first
    assert sorted(report["covered"]["sweep"]["world_sizes"]) == sorted(report["offered"]["sweep"]["world_sizes"])
    assert report["covered"]["sweep"]["link"] == ["'a'", "'b'"]
    full = ExperimentPanel("full", experiment=experiment, render=lambda r: None,
                           controls={"world_sizes": widgets.SelectMultiple(options=[1, 2], value=(1, 2))})
    full.run()
    ran.clear()
    report = run_every_option([full])  # nothing left out: the lesson's own run covers it, no extra round
    assert report["runs"] == 0 and ran == [] and report["covered"]["full"]["world_sizes"] == ["1", "2"]
