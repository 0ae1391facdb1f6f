"""The one panel every notebook uses: controls + Run button + output, with the result kept in Python.

    panel = ExperimentPanel(
        "Bucket size", experiment=bucket_size_sweep, render=plot_sweep,
        controls={"world_size": IntSlider(value=2, min=1, max=4, description="ranks")},
    )
    panel            # shows the controls; pressing Run calls experiment(**values), then render(result)
    panel.run()      # the same path from code (the notebook's check cells use it)
    panel.result     # the last result, plain data

A panel whose experiment takes ``trace=`` (the ones that draw timelines) writes each run's trace to
``traces/<panel title>.json`` beside the notebook and shows a link to it under the results: a file that
ui.perfetto.dev and ``chrome://tracing`` open (``dpteach/replica/trace.py``).

While a run goes, the learner sees it go: at the click the status says "running", the previous result stays
in place, greyed (class ``dpteach-replacing``), and what the run prints and its progress bars ("starting 2
ranks", then the run's own steps) appear in a strip of their own under the button (``dpteach-live``). The old
result is replaced only when the new one is ready, so the figure never blinks to a blank area.

The button and the output carry stable CSS classes (``dpteach-run``, ``dpteach-output``,
``dpteach-status``, whose text carries ``data-runs``: the number of finished runs) so that a browser test can
find them and tell a new result from the last one. What a run prints and displays is written
into the output area by the kernel (``capture.write_into``), so no front end has to answer for it. Errors from a run are shown in the
output area in one readable line (with the rank's traceback for a ``RankError``) instead of
breaking the panel, and the button is re-enabled whatever happens.
"""
from __future__ import annotations

import html
import inspect
import itertools
import math
import os
import re
import sys
import textwrap
import time
import weakref
from types import SimpleNamespace

import ipywidgets as widgets
from IPython.display import HTML, display

from ..ranks.backend import Placement, visible_gpus
from ..ranks.gpus import read_machine
from ..replica.models import MODELS, parameter_count
from ..replica.sizing import describe_choice
from .. import front_end
from .capture import write_into
from .prediction import Prediction, PredictionBox
from .record import record_run


def run_notes(result, model_chosen: bool = True) -> list[str]:
    """What every panel prints under a run's results: which model ran and why (a training experiment's
    ``model_choice``), that its peers were emulated (``peers_note``), and how ranks shared GPUs.
    ``model_chosen``: whether the panel has a model control (only then did the learner ask for the model)."""
    if not isinstance(result, dict):
        return []
    notes = []
    if isinstance(result.get("model_choice"), dict):
        notes.append(f"Model: {describe_choice(result['model_choice'])}.")
    elif result.get("model") in MODELS:  # an experiment that trains the model it was given, on every device
        why = "as the panel asked" if model_chosen else "the lesson's model on every device"
        notes.append(f"Model: {result['model']} ({parameter_count(result['model']) / 1e6:.1f} M parameters), {why}: "
                     f"what this experiment shows (results, order, structure) does not depend on the model's size.")
    if result.get("peers_note"):
        notes.append(f"Peers: {result['peers_note']}.")
    sharing = sharing_note(result)
    if sharing:
        notes.append(f"Note: {sharing}.")
    between = link_note(result)
    if between:
        notes.append(f"Between the GPUs: {between}.")
    return notes


def spoken(value) -> str:
    """A control's value as prose says it: ``('kill', 'hang')`` -> ``kill, hang``; ``None`` -> ``none``."""
    if value is None:
        return "none"
    if isinstance(value, (tuple, list)):
        return ", ".join(spoken(v) for v in value) or "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    return html.escape(f"{value:g}" if isinstance(value, float) else str(value))


def sharing_note(result) -> str | None:
    """For a run whose ranks took turns on fewer GPUs than ranks, the sentence that says what its
    timings then measure (every lesson shows it under the results); None otherwise."""
    if not isinstance(result, dict) or result.get("device") != "cuda" or not isinstance(result.get("world_size"), int):
        return None
    gpus = visible_gpus()
    ranks = result.get("real_ranks", result["world_size"])  # emulated peers: one real rank
    return Placement(result.get("backend", "gloo"), "cuda", gpus).describe_sharing(ranks) if gpus else None


def link_note(result) -> str | None:
    """For a run whose real NCCL ranks talked GPU to GPU: the link that carried their bytes on this machine (NVLink,
    PCIe peer-to-peer, or host memory when the GPUs have no peer access) and what the course set for it; None
    otherwise (gloo ranks, one rank with emulated peers, CPU)."""
    if (not isinstance(result, dict) or result.get("backend") != "nccl" or result.get("device") != "cuda"
            or result.get("real_ranks", result.get("world_size")) in (None, 1)):
        return None
    machine = read_machine()
    if machine.count < 2:
        return None
    settings = machine.nccl_settings()
    return machine.link_sentence() + (f" (the course set {', '.join(map(str, settings))})" if settings else "")


def trace_link(path: str) -> str:
    """The line under a panel that shows a timeline: where its trace is, and how to open it."""
    where = html.escape(path)
    return (f"<div class='dpteach-trace'>&#128269; This run's trace: <a href='{where}' download>{where}</a> "
            f"&mdash; open it at <a href='https://ui.perfetto.dev' target='_blank'>ui.perfetto.dev</a> (it runs in "
            f"your browser: the file is not uploaded) or at <code>chrome://tracing</code>: one process per rank, a "
            f"thread per stream, each span's step, bucket and bytes under a click.</div>")


TRACE_FOLDER = "traces"
NOTE_WIDTH = 110  # printed notes are wrapped between words here, so no front end breaks one mid-word
_serials = itertools.count()
# How a result being replaced looks, and the running status; one <style> per panel (front ends drop duplicates).
STYLE = ("<style>.dpteach-replacing{opacity:0.45;filter:grayscale(1);transition:opacity .2s}"
         ".dpteach-running{color:#8a5a00}</style>")


def check_on_grid(name: str, control) -> None:
    """A slider whose value is off its step grid is moved by the browser to the nearest step when it is drawn,
    so the run would use a value the notebook never asked for: refuse it here, where the panel is built."""
    if not isinstance(control, (widgets.IntSlider, widgets.FloatSlider)):
        return
    step = control.step or 1
    position = (control.value - control.min) / step
    if abs(position - round(position)) > 1e-6:
        below = control.min + math.floor(position) * step
        raise ValueError(f"{name}={control.value:g} is not allowed for the slider {control.description or name!r}: it moves in "
                         f"steps of {step:g} from {control.min:g}, so a browser would show and run "
                         f"{below:g} or {below + step:g} instead; start it at one of those")


class ExperimentPanel:
    _built: "weakref.WeakSet" = weakref.WeakSet()  # every panel alive in this kernel (widgets/options.py runs them)

    @classmethod
    def every_panel(cls) -> list:
        """The panels built in this kernel and still alive, in the order they were built."""
        return sorted(cls._built, key=lambda panel: panel.serial)

    def __init__(self, title: str, experiment, render, controls: dict | None = None, fixed: dict | None = None,
                 run_label: str = "Run", prediction: Prediction | None = None):
        self.serial = next(_serials)
        ExperimentPanel._built.add(self)
        self.title, self.experiment, self.render = title, experiment, render
        self.controls = dict(controls or {})
        for name, control in self.controls.items():  # whole labels ("compute ms", not "compute ...")
            check_on_grid(name, control)
            if hasattr(getattr(control, "style", None), "description_width"):
                control.style.description_width = "initial"
        self.fixed = dict(fixed or {})
        takes_trace = "trace" in inspect.signature(experiment).parameters and "trace" not in self.fixed
        slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-") or "run"
        self.trace_path = os.path.join(TRACE_FOLDER, f"{slug}.json") if takes_trace else None
        self.result = None
        self.history: list[dict] = []  # every run's values and result, in order
        self.runs = 0  # finished runs, failed ones included (the status line carries it as data-runs)
        self.error: BaseException | None = None
        self.button = widgets.Button(description=run_label, button_style="primary", icon="play")
        self.button.add_class("dpteach-run")
        self.status = widgets.HTML()
        self.status.add_class("dpteach-status")
        self.output = widgets.Output()
        self.output.add_class("dpteach-output")
        self.live = widgets.Output()  # a running run's progress bars and what it prints, above the old result
        self.live.add_class("dpteach-live")
        self.stale = widgets.HTML()  # after a second run: the cells below describe an earlier one
        self.stale.add_class("dpteach-stale")
        self.button.on_click(lambda _: self.run())
        header = widgets.HTML(f"<b>{title}</b>")
        style = widgets.HTML(STYLE)
        style.add_class("dpteach-style")
        self.prediction = PredictionBox(prediction) if prediction is not None else None
        asked = [self.prediction.widget] if self.prediction else []
        self.widget = widgets.VBox([header, style, *self.controls.values(), *asked,
                                    widgets.HBox([self.button, self.status]), self.stale, self.live, self.output])
        self.widget.add_class("dpteach-panel")

    def values(self) -> dict:
        return {**self.fixed, **{name: control.value for name, control in self.controls.items()}}

    def run(self, **overrides):
        """Run the experiment with the controls' values (``overrides`` win); render and return the result."""
        values = {**self.values(), **overrides}
        try:
            predicted = self.prediction.read() if self.prediction else None
        except ValueError as refused:  # text that is not a number: said beside the box, and nothing runs
            self.error = refused
            self.runs += 1
            self.status.value = (f"<span data-runs='{self.runs}' style='color:#b00'>not run: the prediction box holds "
                                 f"no number (see beside it)</span>")
            return self.result
        self.button.disabled = True
        self.status.value = "<span class='dpteach-running'>&#9203; running: the result below is the last one</span>"
        if self.output.outputs:
            self.output.add_class("dpteach-replacing")
        self.live.outputs = ()
        drawn = SimpleNamespace(outputs=())  # the new result is drawn off screen, then replaces the old at once
        start = time.perf_counter()
        try:
            with write_into(self.live):  # not `with self.live:` - see capture.py for why
                extra = {"trace": self.trace_path} if self.trace_path and "trace" not in values else {}
                self.result = self.experiment(**values, **extra)
            with write_into(drawn):
                self.render(self.result)
                for note in run_notes(self.result, model_chosen="model" in self.controls):
                    print(textwrap.fill(note, width=NOTE_WIDTH, break_long_words=False, break_on_hyphens=False))
                if isinstance(self.result, dict) and self.result.get("trace"):
                    display(HTML(trace_link(self.result["trace"])))
                scored = self.prediction.score(predicted, self.result) if self.prediction else None
                if scored:
                    display(HTML(scored))
            self._replace_output(drawn.outputs)
            self.error = None
            self.runs += 1
            self.status.value = f"<span data-runs='{self.runs}'>done in {time.perf_counter() - start:.1f} s</span>"
            self.history.append({"values": values, "result": self.result})
            self.stale.value = self._stale_note()
            record_run(self.title, values, self.result, None, time.perf_counter() - start)
        except Exception as exc:  # shown to the learner, kept for code that wants to re-raise it
            self.error = exc
            self.runs += 1
            self.status.value = f"<span data-runs='{self.runs}' style='color:#b00'>failed: {type(exc).__name__}</span>"
            error = {"output_type": "stream", "name": "stdout", "text": f"{type(exc).__name__}: {exc}\n"}
            self._replace_output((*drawn.outputs, error))  # what the run printed and drew before it failed, then why
            record_run(self.title, values, None, exc, time.perf_counter() - start)
        finally:
            self.button.disabled = False
            self.output.remove_class("dpteach-replacing")
            self.live.outputs = ()
        if not front_end.widgets_drawn():  # nothing would show the widget's outputs: write them into the cell
            self._show_plain(values)
        return self.result

    def _values_text(self, values: dict) -> str:
        """``ranks W=2, model=mlp``: the controls' values, as a plain panel prints them above its results."""
        def shown(name, control):  # a choice's own label where the value is the control's (2^24, not 1.67772e+07)
            label = getattr(control, "label", None)
            if label is not None and values.get(name) == control.value:
                return str(label)
            return html.unescape(spoken(values.get(name)))
        return ", ".join(f"{getattr(control, 'description', '') or name}={shown(name, control)}"
                         for name, control in self.controls.items())

    def _show_plain(self, values: dict) -> None:
        """The run's results as plain outputs of the running cell: the values first, then what the run printed and
        drew, in order (the same items the widget's output area holds; its closed progress bars are not kept)."""
        print(f"{self.title} - run {self.runs}: {self._values_text(values) or 'no controls'}")
        for item in self.output.outputs:
            if item.get("output_type") == "stream":
                (sys.stderr if item.get("name") == "stderr" else sys.stdout).write(item.get("text", ""))
            elif item.get("output_type") in ("display_data", "execute_result"):
                display(item["data"], raw=True, metadata=item.get("metadata") or {})

    def _replace_output(self, items) -> None:
        """The output becomes, in one change, what the run printed (its progress bars have closed by now and are
        not kept) followed by ``items``: no moment in which the learner sees an empty area."""
        self.output.outputs = tuple(self.live.outputs) + tuple(items)
        self.live.outputs = ()

    def _stale_note(self) -> str:
        """What to tell the learner once the text and checks below describe an earlier run ("" before)."""
        if len(self.history) < 2:
            return ""
        before, now = self.history[-2]["values"], self.history[-1]["values"]
        names = {name: getattr(control, "description", "") or name for name, control in self.controls.items()}
        changed = [f"{names.get(name, name)} {spoken(before.get(name))} &rarr; {spoken(now[name])}" for name in now
                   if name in names and before.get(name) != now[name]]
        what = f" (changed: {', '.join(changed)})" if changed else ""
        return ("<div style='background:#fff8c5;padding:4px 8px;border-radius:4px'>&#9888; The cells below this "
                f"panel were run on an earlier result{what}. To bring their text and checks up to date, select "
                "the next cell and use <i>Run &#9656; Run Selected Cell and All Below</i>.</div>")

    def _ipython_display_(self):
        if front_end.widgets_drawn():
            display(self.widget)
            return
        values, why = self._values_text(self.values()) or "no controls", front_end.why()
        shown = (f"<div class='dpteach-plain-panel'><b>{html.escape(self.title)}</b>: {html.escape(values)}<br>"
                 f"<i>{html.escape(why)}</i></div>")
        display({"text/plain": f"{self.title} - {values}\n({why})", "text/html": shown}, raw=True)
