"""Stored ipywidgets state turned into static outputs, for the site's pages.

The lessons' panels are widgets (an ipywidgets ``Output`` inside a ``VBox``) that a static page would show
as "VBox(...)". On the page each widget's view becomes what its ``Output`` widgets captured - tables,
printed lines, figures inline - read from the stored widget state, under one line that says it was an
interactive panel and the options it ran with. A lesson's quiz widget becomes a link to its topic's quiz
page, where each item is written out with its answer and explanations folded.

Its own file because it knows ipywidgets' model names and state, which nothing else of the site needs:
``pages.py`` hands it a notebook's stored widget state and gets plain nbformat outputs back.
"""
from __future__ import annotations

import html
import re

from compaction import META, QUIZ_CLASS, WIDGET_VIEW  # site/compaction.py (build.py puts site/ on sys.path)

PANEL_CLASS = "dpteach-panel"
NOTE = "dpteach-static-note"

CHOICE_MODELS = ("DropdownModel", "ToggleButtonsModel", "RadioButtonsModel", "SelectModel", "SelectionSliderModel")
MULTI_CHOICE_MODELS = ("SelectMultipleModel", "SelectionRangeSliderModel")
VALUE_MODELS = ("IntSliderModel", "FloatSliderModel", "FloatLogSliderModel", "IntRangeSliderModel",
                "FloatRangeSliderModel", "IntTextModel", "FloatTextModel", "BoundedIntTextModel",
                "BoundedFloatTextModel", "CheckboxModel", "ToggleButtonModel", "TextModel", "TextareaModel",
                "ColorPickerModel", "DatePickerModel")
TEXT_MODELS = ("HTMLModel", "HTMLMathModel", "LabelModel")
PROGRESS_MODELS = ("FloatProgressModel", "IntProgressModel")


def _ref(value: str) -> str:
    return value[len("IPY_MODEL_"):] if isinstance(value, str) and value.startswith("IPY_MODEL_") else value


def _classes(model: dict) -> list:
    return model.get("state", {}).get("_dom_classes", []) or []


def _html_output(markup: str) -> dict:
    return {"output_type": "display_data", "metadata": {}, "data": {"text/html": markup}}


def _control_value(model: dict):
    """A control's value as the panel used it: the chosen label of a choice, else its value (None: skip)."""
    name, state = model["model_name"], model["state"]
    labels = state.get("_options_labels") or []
    if name in CHOICE_MODELS:
        index = state.get("index")
        return labels[index] if isinstance(index, int) and 0 <= index < len(labels) else "none"
    if name in MULTI_CHOICE_MODELS:
        chosen = [labels[i] for i in state.get("index") or () if isinstance(i, int) and 0 <= i < len(labels)]
        return ", ".join(chosen) if name == "SelectMultipleModel" else " to ".join(chosen)
    if name in VALUE_MODELS:
        value = state.get("value")
        if value in ("", None):  # an empty text box (the prediction a learner may type): nothing was chosen
            return None
        if isinstance(value, bool):
            return "on" if value else "off"
        if isinstance(value, float):
            return f"{value:g}"
        if isinstance(value, list):
            return " to ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
        return str(value)
    return None


PROGRESS_BAR = re.compile(r"\d+%\|.*\|\s*\d+/\d+")  # tqdm's text: "3 runs: 40%|####  | 2/5 [00:01<...]"


class WidgetRenderer:
    """Turns a stored widget view into the outputs its Output widgets captured, for one notebook."""

    def __init__(self, state: dict, quiz_link, fix_html=lambda markup: markup):
        self.state = state
        self.quiz_link = quiz_link  # (output metadata, model) -> html
        self.fix_html = fix_html  # applied to the HTML the run itself showed (not to the notes made here)
        self.panels = self.quizzes = 0

    def expand(self, output: dict) -> list[dict]:
        """One cell output -> the static outputs that replace it (itself, if it shows no widget)."""
        data = output.get("data", {})
        view = data.get(WIDGET_VIEW)
        if not isinstance(view, dict):
            return [self._plain(output)]
        model = self.state.get(view.get("model_id"))
        if model is None:  # the kernel closed the widget before the state was saved: its text is all there is
            text = data.get("text/plain", "")
            text = "".join(text) if isinstance(text, list) else text
            if PROGRESS_BAR.search(text):  # a progress bar that closed ("starting 2 ranks: 0%|...| 0/2"): the
                return []                  # page keeps the results, not a bar frozen at the moment it was saved
            shown = "" if text.lstrip().startswith(("VBox(", "HBox(", "Output(")) else f": {html.escape(text)}"
            return [_html_output(f"<div class='{NOTE}'>An interactive widget, not saved with this run{shown}</div>")]
        if QUIZ_CLASS in _classes(model):
            self.quizzes += 1
            return [_html_output(self.quiz_link(output.get("metadata", {}).get(META, {}).get("quiz", {}), model))]
        controls, status, title, body = [], [], [], []
        self._walk(model, controls, status, title, body, top=True)
        if PANEL_CLASS in _classes(model) or controls:
            self.panels += 1
            body.insert(0, _html_output(self._note(title, controls, status)))
        elif title:  # a bold first line of some other widget: shown as it is
            body.insert(0, _html_output(f"<b>{title[0]}</b>"))
        return body

    def _plain(self, output: dict) -> dict:
        """An output as a plain, valid nbformat output (an Output widget's may lack fields)."""
        kind = output.get("output_type")
        if kind in ("display_data", "execute_result", "update_display_data"):
            data = dict(output.get("data", {}))
            if "text/html" in data:
                markup = data["text/html"]
                data["text/html"] = self.fix_html("".join(markup) if isinstance(markup, list) else markup)
            return {"output_type": "display_data", "metadata": output.get("metadata", {}), "data": data}
        if kind == "stream":
            text = output.get("text", "")
            return {"output_type": "stream", "name": output.get("name", "stdout"),
                    "text": "".join(text) if isinstance(text, list) else text}
        if kind == "error":
            return {"output_type": "error", "ename": output.get("ename", ""), "evalue": output.get("evalue", ""),
                    "traceback": output.get("traceback", [])}
        return output

    def _walk(self, model: dict, controls, status, title, body, top=False):
        name, state = model["model_name"], model["state"]
        classes = _classes(model)
        if name == "OutputModel":
            for captured in state.get("outputs", []):
                body.extend(self.expand(captured))
            return
        if QUIZ_CLASS in classes:  # a quiz inside another widget
            self.quizzes += 1
            body.append(_html_output(self.quiz_link({}, model)))
            return
        if name in TEXT_MODELS:
            value = state.get("value") or ""
            if "dpteach-style" in classes:  # the panel's own CSS (its running state): nothing to show on a page
                return
            if "dpteach-status" in classes:
                status.append(re.sub(r"<[^>]+>", "", value))
            elif re.fullmatch(r"\s*<b>[^<]*</b>\s*", value) and top is False and not title and not body:
                title.append(re.sub(r"</?b>", "", value).strip())  # the panel's header: said in the note
            elif value.strip():
                body.append(_html_output(self.fix_html(value) if name != "LabelModel" else html.escape(value)))
            return
        if name in PROGRESS_MODELS:
            body.append(_html_output(f"<progress value='{state.get('value', 0)}' max='{state.get('max', 100)}'>"
                                     f"</progress>"))
            return
        value = _control_value(model)
        if value is not None:
            controls.append((state.get("description") or name.removesuffix("Model"), value))
            return
        children = [self.state[_ref(c)] for c in state.get("children", []) if _ref(c) in self.state]
        if name == "HBoxModel" and children and all(c["model_name"] in TEXT_MODELS + PROGRESS_MODELS + ("ButtonModel",)
                                                     for c in children):
            parts = []  # a row of text and bars (a progress bar's description, bar and count): one line
            for child in children:
                inner = []
                self._walk(child, controls, status, title, inner)
                parts += [o["data"]["text/html"] for o in inner]
            if parts:
                body.append(_html_output("<div style='display:flex;gap:0.6em;align-items:center'>"
                                         + "".join(f"<span>{p}</span>" for p in parts) + "</div>"))
            return
        for child in children:
            self._walk(child, controls, status, title, body)

    @staticmethod
    def _note(title, controls, status) -> str:
        what = f"<b>{title[0]}</b>" if title else "panel"
        options = "; ".join(f"{html.escape(str(k))} = <code>{html.escape(str(v))}</code>" for k, v in controls)
        took = f" ({html.escape(status[-1])})" if status and status[-1].strip() else ""
        shown = f", shown as it ran with {options}{took}" if options else f", shown as it ran{took}"
        return (f"<div class='{NOTE}'>&#9654; Interactive {what}{shown}. In the notebook you change the options "
                f"and press Run.</div>")
