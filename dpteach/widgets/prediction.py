"""Predict, run, compare: a number the learner types before a panel runs, checked against what the run measured.

Performance work is a loop - predict from a cost model, run, read what happened, explain the gap - and a
prediction written down before the run is the part that teaches: afterwards every number looks obvious.
A :class:`Prediction` gives a panel a question and a box for the answer. The box may stay empty (a
prediction is never required to go on); text that is not a number stops the run with a message that says
so beside the box, and nothing runs. After the run the panel shows the prediction beside the measurement, the
relative error and where the gap comes from (the lesson's own explanation, from the run's numbers), and
records the attempt in the learner's progress (``dpteach progress``).
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Callable

import ipywidgets as widgets

from ..progress import ProgressStore


@dataclass
class Prediction:
    """``key`` names the question in the progress file; ``lesson`` its lesson ("02"); ``question`` what to
    predict (HTML); ``unit`` the unit of the answer; ``measure(result)`` the run's value in that unit;
    ``explain(result, predicted)`` where the gap between the two comes from (HTML), from the run's numbers.
    ``measure`` returns None when the run, as the learner set it up, measured nothing to compare with.
    ``obtained`` says how the run got its value, for the score's sentence: "measured" by default; a value a
    rule or formula computes from the panel's settings says "computed" (Young's interval), so that a formula's
    result is never called a measurement."""

    key: str
    lesson: str
    question: str
    unit: str
    measure: Callable[[dict], float | None]
    explain: Callable[[dict, float], str]
    obtained: str = "measured"


def parse(text: str, unit: str) -> float | None:
    """The number typed (None for an empty box); a ValueError that says what is wrong otherwise."""
    text = (text or "").strip().replace(",", "")
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"prediction={text!r} is not allowed: type a number in {unit} (e.g. 12.5 or 3e-3), "
                         f"or leave the box empty to run without predicting") from None
    if not math.isfinite(value):
        raise ValueError(f"prediction={text!r} is not allowed: type a finite number in {unit}")
    return value


def verdict(error: float) -> str:
    """A word for a relative error, as an engineer would say it of a back-of-the-envelope estimate."""
    size = abs(error)
    if size <= 0.1:
        return "within 10%: your estimate models this run well"
    if size <= 0.5:
        return "within 50%: the right order of magnitude"
    return "off by more than half: your estimate leaves out something this run does"


class PredictionBox:
    """The question, the box, and the score under the run (what :class:`ExperimentPanel` shows)."""

    def __init__(self, prediction: Prediction):
        self.prediction = prediction
        self.text = widgets.Text(placeholder=f"your prediction, in {prediction.unit} (optional)",
                                 description="prediction", style={"description_width": "initial"},
                                 layout=widgets.Layout(width="360px"))
        self.text.add_class("dpteach-prediction")
        self.note = widgets.HTML()  # a refused answer's message, next to the box it is about
        self.note.add_class("dpteach-prediction-note")
        self.widget = widgets.VBox([widgets.HTML(f"<div>&#9998; <b>Predict first.</b> {prediction.question}</div>"),
                                    widgets.HBox([self.text, self.note])])
        self.last: dict | None = None  # the last scored attempt

    def read(self) -> float | None:
        """The number in the box (None when empty); text that is not a number raises the ValueError of
        :func:`parse` and shows its message beside the box."""
        try:
            value = parse(self.text.value, self.prediction.unit)
        except ValueError as refused:
            self.note.value = f"<span style='color:#b00'>{html.escape(str(refused))}</span>"
            raise
        self.note.value = ""
        return value

    def score(self, predicted: float | None, result: dict) -> str | None:
        """HTML comparing ``predicted`` with the run's measurement (None when nothing was predicted), and the
        attempt recorded in the progress file."""
        if predicted is None:
            self.last = None
            return None
        p = self.prediction
        measured = p.measure(result)
        if not measured:  # None, or 0: no relative error to give
            self.last = None
            return (f"<div class='dpteach-prediction-score'>You predicted {predicted:.4g} {html.escape(p.unit)}, "
                    f"but this run, as the panel was set, {p.obtained} nothing to compare it with; change the "
                    f"controls back and run again.</div>")
        measured = float(measured)
        error = (predicted - measured) / measured
        self.last = {"predicted": predicted, "measured": measured, "error": error}
        ProgressStore().record_prediction(p.key, p.lesson, predicted, measured, p.unit)
        side = "over" if error > 0 else "under"
        return (f"<div class='dpteach-prediction-score' data-error='{error:.6g}' style='background:#eef5ff;"
                f"padding:6px 10px;border-radius:4px'>You predicted <b>{predicted:.4g} {html.escape(p.unit)}</b>; "
                f"this run {p.obtained} <b>{measured:.4g} {html.escape(p.unit)}</b>: {abs(error):.0%} {side} "
                f"({verdict(error)}).<br>{p.explain(result, predicted)}</div>")
