"""The quiz as an ipywidgets panel inside a notebook: pick, submit, read why each option is right or wrong.

The panel is plain ipywidgets 8 (RadioButtons, Checkboxes, Button, HTML), so it works in
JupyterLab 4 without a custom front-end. Everything the learner can do by clicking can also be
done from Python (``panel.items[0].choose([...]); panel.items[0].submit()``), which is how the
tests drive it; the state the clicks change lives in the widgets themselves, so both paths agree.

Stable CSS classes (``dpteach-quiz``, ``dpteach-quiz-item``, ``dpteach-quiz-choices``,
``dpteach-quiz-submit``, ``dpteach-quiz-retry``, ``dpteach-quiz-message``, ``dpteach-quiz-feedback``, ``dpteach-quiz-score``)
let a browser test find the parts without depending on widget internals.
"""
from __future__ import annotations

import re
import warnings
from html import escape

import ipywidgets as widgets
from ipywidgets.widgets.widget_bool import CheckboxStyle
from ipywidgets.widgets.widget_description import DescriptionStyle
from ipywidgets.widgets.widget_string import HTMLStyle

from ..progress import ProgressStore
from .bank import Item
from .scoring import count_problem, is_correct, option_order, resolve_choices

# ipywidgets truncates long radio/checkbox labels to one line; quiz options are sentences.
_STYLE = """<style>
.dpteach-quiz .widget-radio-box label, .dpteach-quiz .jupyter-widget-radio-box label,
.dpteach-quiz .widget-checkbox .widget-label-basic, .dpteach-quiz .jupyter-widget-checkbox .widget-label-basic {
  white-space: normal; overflow: visible; height: auto; line-height: 1.4; margin: 2px 0;
  display: flex; align-items: flex-start; gap: 6px; }
.dpteach-quiz .widget-radio-box label input, .dpteach-quiz .jupyter-widget-radio-box label input {
  flex: none; margin-top: 0.3em; order: -1; }
.dpteach-quiz .widget-checkbox, .dpteach-quiz .jupyter-widget-checkbox { height: auto; width: 100%; }
.dpteach-quiz-feedback li { margin-bottom: 6px; }
</style>"""
_RIGHT, _WRONG = "#1a7f37", "#cf222e"


def marked(text: str) -> str:
    """Bank text as HTML: escaped, with its `code spans` set as code (the bank writes them in backticks)."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", escape(text))


def label(text: str) -> str:
    """Bank text for a plain-text widget label (a radio button's, a checkbox's): its backticks dropped."""
    return re.sub(r"`([^`]+)`", r"\1", text)


def feedback_html(item: Item, shown_order: list[int], chosen: list[str]) -> str:
    """Every option, in the order shown, marked right/wrong and chosen/not, with its explanation."""
    correct = is_correct(item, chosen)
    verdict = ("Correct." if correct else
               "Not quite: compare your choice with the options marked right below.")
    lines = [f'<div class="dpteach-quiz-verdict" style="font-weight:bold;color:{_RIGHT if correct else _WRONG}">'
             f"{verdict}</div>", '<ul class="dpteach-quiz-options">']
    for index in shown_order:
        option = item.options[index]
        picked = option.text in chosen
        # The mark says what the option is; the note says what the learner did with it, and only when
        # that needs saying: an option rightly left out is not the learner's error.
        mark = "&#10003; a right option" if option.correct else "&#10007; a wrong option"
        note = {(True, True): "you chose it", (True, False): "you left it out",
                (False, True): "you chose it", (False, False): ""}[(option.correct, picked)]
        classes = f"dpteach-quiz-option {'right' if option.correct else 'wrong'}{' chosen' if picked else ''}"
        lines.append(f'<li class="{classes}"><span style="color:{_RIGHT if option.correct else _WRONG}">'
                     f"<b>{mark}</b>{f' ({note})' if note else ''}</span> {marked(option.text)}<br>"
                     f'<span class="dpteach-quiz-explanation">{marked(option.explanation)}</span></li>')
    lines.append("</ul>")
    lines.append(f'<div class="dpteach-quiz-trap"><b>Common trap:</b> {marked(item.trap)}</div>')
    if item.demonstrated:
        lines.append(f'<div class="dpteach-quiz-live"><b>See it live:</b> <a href="{escape(item.notebook)}" '
                     f'target="_blank">{escape(item.notebook)}</a>, experiment '
                     f"<code>dpteach.experiments.{escape(item.experiment)}</code></div>")
    else:
        lines.append(f'<div class="dpteach-quiz-live"><b>Read about it:</b> <a href="{escape(item.notebook)}" '
                     f'target="_blank">{escape(item.notebook)}</a>, section <i>{escape(item.section)}</i> '
                     f"(explained there; a run on this machine cannot show it)</div>")
    return "\n".join(lines)


def run_call(run: dict) -> str:
    """``experiment(argument=value, ...)``: the call that wrote a figure's trace."""
    arguments = ", ".join(f"{name}={value!r}" for name, value in run["arguments"].items())
    return f"dpteach.experiments.{run['experiment']}({arguments})"


def figure_widgets(figure: dict) -> list:
    """The figure an item asks about, and where it comes from: the real run, and its trace to open."""
    with open(figure["image"], "rb") as f:
        image = widgets.Image(value=f.read(), format="png", layout=widgets.Layout(max_width="900px"))
    image.add_class("dpteach-quiz-figure")
    source = widgets.HTML(f"<div style='font-size:90%;color:#555'>Drawn from the trace of a real run, "
                          f"<code>{escape(run_call(figure['run']))}</code>; the trace itself, to open at "
                          f"ui.perfetto.dev: <code>{escape(figure['trace'])}</code></div>")
    return [image, source]


class Looks:
    """The layout and style models a quiz's widgets share.

    Every ipywidget is a model the kernel opens on the page, and so is each widget's own ``Layout`` and (for most
    kinds) its own ``Style``: left to their defaults, a question built about 27 models, a lesson's quiz of 25
    questions 678, each a message the page must handle before it can show anything. Widgets whose layout or style
    never changes on its own share one of each here; the few that change their own (the Try again button, shown
    only after a submission) keep theirs."""

    def __init__(self):
        self.plain = widgets.Layout()
        self.full_width = widgets.Layout(width="100%")
        self.html = HTMLStyle()
        self.button = widgets.ButtonStyle()
        self.checkbox = CheckboxStyle()
        self.choices = DescriptionStyle()

    def html_widget(self, value: str = "") -> widgets.HTML:
        return widgets.HTML(value, layout=self.plain, style=self.html)

    def box(self, kind, children) -> widgets.Box:
        return kind(children, layout=self.plain)


class QuizItemView:
    """One question: its choice widgets, a Submit button, and the feedback shown after submitting."""

    def __init__(self, item: Item, number: int, seed: int, on_submitted, show_topic: bool = True,
                 looks: Looks | None = None):
        self.item, self.number = item, number
        self.looks = looks = looks or Looks()
        self.seed, self.attempt = seed, 0
        self.order = option_order(item, seed)
        self.result: dict | None = None
        self._on_submitted = on_submitted
        shown = [item.options[index].text for index in self.order]
        how_many = "pick one" if item.type == "single" else f"pick {item.select}"
        topic = f" &middot; {escape(item.topic_title)}" if show_topic else ""  # not in a quiz of one topic
        header = looks.html_widget(f"<b>Question {number}</b>{topic} &middot; <i>{how_many}</i>")
        # pre-wrap keeps the line breaks of stems that contain code and still wraps long prose lines
        stem = looks.html_widget(f'<div style="white-space: pre-wrap; line-height: 1.4">{marked(item.stem)}</div>')
        stem.add_class("dpteach-quiz-stem")
        shown_with = [stem, *figure_widgets(item.figure)] if item.figure else [stem]
        if item.type == "single":
            self._radio = widgets.RadioButtons(options=[(label(text), text) for text in shown], value=None,
                                               layout=looks.full_width, style=looks.choices)
            self._checks = []
            choices = self._radio
        else:
            self._radio = None
            self._checks = self._checkboxes(shown)
            choices = looks.box(widgets.VBox, self._checks)
        choices.add_class("dpteach-quiz-choices")
        self._choices = choices
        self.submit_button = widgets.Button(description="Submit", button_style="primary", layout=looks.plain,
                                            style=looks.button)
        self.submit_button.add_class("dpteach-quiz-submit")
        self.submit_button.on_click(lambda _button: self.submit())
        self.retry_button = widgets.Button(description="Try again", icon="refresh", style=looks.button,
                                           layout=widgets.Layout(display="none"))  # its own: shown after a submission
        self.retry_button.add_class("dpteach-quiz-retry")
        self.retry_button.on_click(lambda _button: self.try_again())
        self.message = looks.html_widget().add_class("dpteach-quiz-message")
        self.feedback = looks.html_widget().add_class("dpteach-quiz-feedback")
        self.widget = looks.box(widgets.VBox, [header, *shown_with, choices,
                                               looks.box(widgets.HBox, [self.submit_button, self.retry_button]),
                                               self.message, self.feedback])
        self.widget.add_class("dpteach-quiz-item")

    @property
    def chosen(self) -> list[str]:
        """The option texts currently selected, in bank order."""
        if self._radio is not None:
            picked = [] if self._radio.value is None else [self._radio.value]
        else:
            picked = [check.option for check in self._checks if check.value]
        return [option.text for option in self.item.options if option.text in picked]

    def _checkboxes(self, shown: list[str]) -> list:
        """One checkbox per option shown, labelled for reading and knowing the bank text it stands for."""
        checks = []
        for text in shown:
            check = widgets.Checkbox(value=False, description=label(text), indent=False,
                                     layout=self.looks.full_width, style=self.looks.checkbox)
            check.option = text
            checks.append(check)
        return checks

    def choose(self, answers) -> None:
        """Select options as a learner would: by option text or by 0-based index in bank order."""
        texts = resolve_choices(self.item, answers)
        if self._radio is not None:
            if len(texts) > 1:
                raise ValueError(f"item {self.item.id!r} takes one answer; got {len(texts)}: {texts}")
            self._radio.value = texts[0] if texts else None
        else:
            for check in self._checks:
                check.value = check.option in texts

    def submit(self) -> dict | None:
        """Judge the current choice; returns the result, or None when the submission is refused."""
        if self.result is not None:
            self.message.value = "<i>Already submitted: press <b>Try again</b> for a fresh attempt.</i>"
            return None
        chosen = self.chosen
        refusal = count_problem(self.item, chosen)
        if refusal:
            self.message.value = f'<span style="color:{_WRONG}">{escape(refusal)}</span>'
            return None
        self.result = {"id": self.item.id, "topic": self.item.topic, "correct": is_correct(self.item, chosen),
                       "chosen": chosen, "expected": self.item.expected}
        self.message.value = ("<i>Submitted. <b>Try again</b> clears your answer and shows the options in a "
                              "new order; every attempt is recorded.</i>")
        self.feedback.value = feedback_html(self.item, self.order, chosen)
        self._lock(True)
        self._on_submitted(self)
        return self.result

    def try_again(self) -> None:
        """A fresh attempt: the choice cleared, the options reshuffled, the feedback hidden."""
        self.attempt += 1
        previous = self.order
        for offset in range(8):  # a new order when the item has one (two options have only two orders)
            self.order = option_order(self.item, self.seed + 7919 * (self.attempt + offset))
            if self.order != previous:
                break
        shown = [self.item.options[index].text for index in self.order]
        if self._radio is not None:
            self._radio.options = [(label(text), text) for text in shown]
            self._radio.value = None
        else:
            self._checks = self._checkboxes(shown)
            self._choices.children = self._checks
        self.result = None
        self.message.value = self.feedback.value = ""
        self._lock(False)
        self._on_submitted(self)

    def _lock(self, submitted: bool) -> None:
        self.submit_button.disabled = submitted
        self.retry_button.layout.display = None if submitted else "none"
        for control in [self._radio, *self._checks]:
            if control is not None:
                control.disabled = submitted


class QuizPanel:
    """A list of questions with a score line; displays itself when it is a cell's last expression."""

    def __init__(self, items: list[Item], seed: int = 0, store: ProgressStore | None = None,
                 record: bool = True, title: str | None = None):
        if not items:
            raise ValueError("a quiz panel needs at least one item")
        self.seed, self.title = seed, title
        self.store = (store or ProgressStore()) if record else None
        # A quiz of one topic whose heading names it does not repeat it over every question.
        named = len({item.topic for item in items}) == 1 and title is not None and items[0].topic_title in title
        looks = Looks()
        self.items = [QuizItemView(item, number, seed, self._submitted, show_topic=not named, looks=looks)
                      for number, item in enumerate(items, 1)]
        self.score_line = looks.html_widget().add_class("dpteach-quiz-score")
        heading = looks.html_widget(f"<h3>{escape(title)}</h3>" if title else "")
        self.widget = looks.box(widgets.VBox, [looks.html_widget(_STYLE), heading,
                                               *[view.widget for view in self.items], self.score_line])
        self.widget.add_class("dpteach-quiz")
        self._update_score()

    @property
    def results(self) -> list[dict]:
        """One dict per submitted item (``id, topic, correct, chosen, expected``), in panel order."""
        return [view.result for view in self.items if view.result is not None]

    @property
    def score(self) -> int:
        return sum(result["correct"] for result in self.results)

    @property
    def max_score(self) -> int:
        return len(self.items)

    def _submitted(self, view: QuizItemView) -> None:
        if self.store is not None and view.result is not None:  # (None: the learner pressed Try again)
            result = view.result
            try:
                self.store.record_quiz(result["id"], result["topic"], result["correct"], result["chosen"])
            except OSError as exc:  # a read-only home must not break the quiz itself
                warnings.warn(f"could not record the answer in {self.store.path}: {exc}")
                view.message.value = f"<i>(not saved to {escape(str(self.store.path))}: {escape(str(exc))})</i>"
        self._update_score()

    def _update_score(self) -> None:
        answered = len(self.results)
        self.score_line.value = (f"<b>Score: {self.score} / {self.max_score}</b> "
                                 f"({answered} of {self.max_score} answered)")

    def _repr_mimebundle_(self, include=None, exclude=None):
        return self.widget._repr_mimebundle_(include=include, exclude=exclude)

    def _ipython_display_(self):
        from IPython.display import display

        from ..front_end import widgets_drawn
        if widgets_drawn():
            display(self.widget)
        else:
            display(self.plain_text(), raw=True)

    def plain_text(self) -> dict:
        """The questions without widgets, for a front end that draws none (``dpteach/front_end.py``): each
        stem and its options in this panel's order, no answers, and where to answer them."""
        topics = sorted({view.item.topic for view in self.items})
        where = f"dpteach quiz --topic {topics[0]}" if len(topics) == 1 else "dpteach quiz"
        lines = [f"{self.title or 'Quiz'} ({self.max_score} questions; this front end draws no widgets: answer them "
                 f"in a terminal with `{where}`, or set DPTEACH_WIDGETS=on where widgets are drawn)"]
        for view in self.items:
            pick = "pick one" if view.item.type == "single" else f"pick {view.item.select}"
            lines += ["", f"{view.number}. ({pick}) {view.item.stem}"]
            lines += [f"   {chr(ord('a') + i)}) {view.item.options[index].text}" for i, index in enumerate(view.order)]
        text = "\n".join(lines)
        return {"text/plain": text, "text/html": f"<pre class='dpteach-quiz-plain'>{escape(text)}</pre>"}

    def __repr__(self) -> str:
        return f"<QuizPanel: {len(self.items)} items, score {self.score}/{self.max_score}>"
