"""Build the course's static website (Sphinx + MyST-NB + sphinx-book-theme), offline, from a real run.

    python site/build.py                        # pages -> site/_pages, HTML -> site/_build/html
    python site/build.py --execute [NAMES...]   # run notebooks (all by default), store them in site/outputs/
    python site/build.py --execute-stale        # build, first running any notebook whose stored run is stale

``make site`` and ``make site-outputs`` run the first two.

Pages: a home page (the course table of ``dpteach.course``), every lesson of ``notebooks/`` and exercise
of ``exercises/`` with the outputs of a real run, one page per quiz topic (read through ``dpteach.quiz``),
the benchmark results (``benchmarks/RESULTS.md``) and what was measured on a GPU
(``benchmarks/results/gpu_check_*.md``, written by ``scripts/gpu_check.sh``).

The outputs come from the executed copies in ``site/outputs/`` (``site/execute.py`` says how they are made
and what they record). The build runs no notebook: it uses a copy only while the fingerprint it recorded
matches the notebook's cells, and stops on a stale or missing one with the command that refreshes it,
unless ``--execute-stale`` is given.

The lessons' panels are widgets (an ipywidgets ``Output`` inside a ``VBox``) that a static page would show
as "VBox(...)". On the page each widget's view becomes what its ``Output`` widgets captured - tables,
printed lines, figures inline - read from the stored widget state, under one line that says it was an
interactive panel and the options it ran with. A lesson's quiz widget becomes a link to its topic's quiz
page, where each item is written out with its answer and explanations folded.

Nothing is fetched: MyST-NB executes nothing (``nb_execution_mode = "off"``), there is no intersphinx, no
widget JavaScript is loaded from a CDN (the pages carry no widget state), and the theme's assets are local.
"""
from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import execute as store  # noqa: E402  (site/execute.py: the stored runs)

REPO = store.REPO
PAGES = HERE / "_pages"
HTML_OUT = HERE / "_build" / "html"
GPU_REPORTS = REPO / "benchmarks" / "results"
WIDGET_VIEW, WIDGET_STATE, META = store.WIDGET_VIEW, store.WIDGET_STATE, store.META
PANEL_CLASS, QUIZ_CLASS = "dpteach-panel", store.QUIZ_CLASS
NOTE = "dpteach-static-note"

CHOICE_MODELS = ("DropdownModel", "ToggleButtonsModel", "RadioButtonsModel", "SelectModel", "SelectionSliderModel")
MULTI_CHOICE_MODELS = ("SelectMultipleModel", "SelectionRangeSliderModel")
VALUE_MODELS = ("IntSliderModel", "FloatSliderModel", "FloatLogSliderModel", "IntRangeSliderModel",
                "FloatRangeSliderModel", "IntTextModel", "FloatTextModel", "BoundedIntTextModel",
                "BoundedFloatTextModel", "CheckboxModel", "ToggleButtonModel", "TextModel", "TextareaModel",
                "ColorPickerModel", "DatePickerModel")
TEXT_MODELS = ("HTMLModel", "HTMLMathModel", "LabelModel")
PROGRESS_MODELS = ("FloatProgressModel", "IntProgressModel")


# -- widgets to static outputs -------------------------------------------------------------------

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


# -- notebook pages -----------------------------------------------------------------------------------

def run_it_box(source: Path, record: dict) -> str:
    relative = f"{source.parent.name}/{source.name}"
    machine, commit = record.get("machine", {}), record.get("dpteach", {})
    gpu = f"GPU {machine['gpu']}" if machine.get("gpu") else "no GPU"
    cpu_only = record.get("environment", {}).get("DPTEACH_GPUS") == "0"
    lines = ["```{admonition} Run it", ":class: tip",
             f"From PyPI: `pip install dpteach`, then `dpteach lab`, and open `{relative}` in the workspace it "
             f"opens (it has `notebooks/` and `exercises/`, like the repository). From a clone of the repository: "
             f"`make lab`, which installs into `.venv` and opens the same notebooks."]
    if source.parent.name == "exercises":
        lines += ["", f"`check(\"{source.stem[:2]}\")` in its last cell grades your code on real ranks; from a "
                      f"terminal, `dpteach grade {relative}`. The outputs below are those of the notebook as it "
                      f"ships: the stub, not yet written."]
    lines += ["", f"The outputs on this page are a real run's: executed {record.get('executed', '?')[:10]} "
                  f"in {record.get('seconds', '?')} s at dpteach {commit.get('version', '?')}, commit "
                  f"`{(commit.get('commit') or '?')[:10]}`, on {machine.get('cpus', '?')} CPU cores, torch "
                  f"{machine.get('torch', '?')}, {gpu}"
                  + (" (CPU-only, as the test suite runs the lessons)." if cpu_only else ".")
                  + " Your own machine's numbers will differ.", "```"]
    return "\n".join(lines)


REPO_LINK = re.compile(r"\[([^\]]+)\]\((?!https?://|mailto:|#)([^)\s]+)\)")


def fix_links(text: str, folder: Path, pages: set) -> str:
    """Links to repository files that are no page of the site become the file's path in the repository."""
    def replace(match):
        target = match.group(2).split("#")[0]
        resolved = (folder / target).resolve()
        if not target or resolved.suffix in (".ipynb", ".md") and resolved in pages:
            return match.group(0)
        try:
            where = resolved.relative_to(REPO)
        except ValueError:
            return match.group(0)
        return f"{match.group(1)} (`{where}` in the repository)"
    return REPO_LINK.sub(replace, text)


HTML_LINK = re.compile(r"<a\s[^>]*href=(['\"])([^'\"]+)\1[^>]*>(.*?)</a>", re.S)


def fix_output_links(markup: str, folder: Path, pages: set) -> str:
    """In an output's HTML: a link to another notebook points to its page; a link to a file the run wrote
    beside the notebook (a trace) becomes the file's path, since the site does not carry it."""
    def replace(match):
        target = match.group(2)
        if re.match(r"[a-z]+:|#|/", target):
            return match.group(0)
        path = (folder / target.split("#")[0]).resolve()
        if path in pages:
            return match.group(0).replace(target, re.sub(r"\.ipynb(#|$)", r".html\1", target), 1)
        try:
            where = path.relative_to(REPO)
        except ValueError:
            where = target
        return f"<code>{html.escape(str(where))}</code>"
    return HTML_LINK.sub(replace, markup)


def notebook_page(source: Path, quiz_titles: dict, pages: set) -> tuple[dict, dict]:
    """The page for one notebook: its stored run, widgets turned into outputs, the Run-it box on top."""
    notebook = store.read_json(store.stored_path(source))
    record = notebook.get("metadata", {}).get(META, {})
    state = notebook.get("metadata", {}).get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})

    def quiz_link(meta: dict, model: dict) -> str:
        topics = [t for t in meta.get("topics", []) if t in quiz_titles]
        count, title = meta.get("items"), meta.get("title") or ""
        if len(topics) == 1:
            what, where = f"Quiz: {quiz_titles[topics[0]]}", f"<a href='../quizzes/{topics[0]}.html'>the quiz page</a>"
        else:  # an exam across topics: the pages of the topics it drew from
            what = title if title not in ("", "Quiz") else ""
            where = ("the quiz pages of its topics: " + ", ".join(
                f"<a href='../quizzes/{t}.html'>{html.escape(quiz_titles[t])}</a>" for t in topics)
                     if topics else "<a href='../quizzes/index.html'>the quiz pages</a>")
        many = f" ({count} questions)" if count and "question" not in what else ""
        named = f": <b>{html.escape(what)}</b>" if what else ""
        return (f"<div class='{NOTE}'>&#9654; An interactive quiz in the notebook{named}{many}. Every question, with "
                f"its answer and explanations, is on {where}.</div>")

    renderer = WidgetRenderer(state, quiz_link, lambda markup: fix_output_links(markup, source.parent, pages))
    for cell in notebook["cells"]:
        if cell["cell_type"] == "markdown":
            text = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
            cell["source"] = fix_links(text, source.parent, pages)
        if cell["cell_type"] != "code":
            continue
        outputs = []
        for output in cell.get("outputs", []):
            outputs.extend(renderer.expand(output))
        cell["outputs"] = outputs
    notebook["metadata"] = {key: value for key, value in notebook.get("metadata", {}).items()
                            if key in ("kernelspec", "language_info")}  # no widget state: nothing to load
    first = next((c for c in notebook["cells"] if c["cell_type"] == "markdown"), None)
    box = run_it_box(source, record)
    if first is not None and first["source"].lstrip().startswith("# "):
        title, _, rest = first["source"].lstrip().partition("\n")
        first["source"] = f"{title}\n\n{box}\n\n{rest.lstrip()}"
    else:
        notebook["cells"].insert(0, {"cell_type": "markdown", "metadata": {}, "source": f"# {source.stem}\n\n{box}"})
    return notebook, {"panels": renderer.panels, "quizzes": renderer.quizzes}


def notebook_title(source: Path) -> str:
    for cell in store.read_json(source)["cells"]:
        text = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        if cell["cell_type"] == "markdown" and text.lstrip().startswith("# "):
            return text.lstrip()[2:].splitlines()[0].strip()
    return source.stem


# -- quiz pages -----------------------------------------------------------------------------------------

def _text(value: str) -> str:
    """Bank text as one line of HTML (the quiz widget shows it as plain text, line breaks kept)."""
    return html.escape(value.strip()).replace("\n", "<br>")


def quiz_page(topic: str, title: str, items: list, figures: Path, lesson_pages: dict) -> str:
    """One topic's page: every item's stem, figure and options; the answer, each option's explanation and the
    trap folded under "Answer"."""
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    lines = [f"# Quiz: {title}", "",
             f"{len(items)} questions in the style of certification practice questions. Each answer is folded: "
             f"choose first, then open it. In the notebooks the same items are a widget that scores you "
             f"(`dpteach.quiz.show(\"{topic}\")`); in a terminal: `dpteach quiz --topic {topic}`.", ""]
    for number, item in enumerate(items, 1):
        lines += [f"({item.id})=", f"## Question {number}", ""]
        pick = "pick one" if item.type == "single" else f"pick {item.select}"
        lines += [f"<div class='dpteach-quiz-stem'><p><i>{pick}</i></p><p>{_text(item.stem)}</p></div>", ""]
        if item.figure:
            image = Path(item.figure["image"])
            figures.mkdir(parents=True, exist_ok=True)
            shutil.copy2(image, figures / image.name)
            alt = f"The figure of question {number}, drawn from the trace of a real run"
            lines += [f"![{alt}](figures/{image.name})", ""]
        options = "".join(f"<li>{_text(option.text)}</li>" for option in item.options)
        correct = [letters[i] for i, option in enumerate(item.options) if option.correct]
        explained = "".join(
            f"<li><b>{letters[i]}</b> &mdash; {'correct' if option.correct else 'not correct'}: "
            f"{_text(option.explanation)}</li>" for i, option in enumerate(item.options))
        page = lesson_pages.get(item.notebook)
        where = f"<a href='../notebooks/{Path(item.notebook).stem}.html'>{html.escape(page or item.notebook)}</a>"
        evidence = (f"shown by a run in {where} (experiment <code>{html.escape(item.experiment)}</code>)"
                    if item.demonstrated else
                    f"explained in {where}, section &ldquo;{html.escape(item.section)}&rdquo;")
        lines += [f"<ol type='A' class='dpteach-quiz-options'>{options}</ol>"
                  f"<details class='dpteach-quiz-answer'><summary>Answer</summary>"
                  f"<p><b>Answer: {', '.join(correct)}</b></p><ul>{explained}</ul>"
                  f"<p><b>The trap:</b> {_text(item.trap)}</p><p>Where the course shows it: {evidence}.</p>"
                  f"</details>", ""]
    return "\n".join(lines)


# -- the other pages ------------------------------------------------------------------------------------

def shift_headings(text: str, top: int) -> str:
    """Move every Markdown heading (outside code fences) so that the highest becomes level ``top``."""
    lines, fenced, levels = text.splitlines(), False, []
    for line in lines:
        fenced ^= line.startswith("```")
        if not fenced and re.match(r"#{1,6} ", line):
            levels.append(len(line) - len(line.lstrip("#")))
    if not levels:
        return text
    shift, out, fenced = top - min(levels), [], False
    for line in lines:
        fenced ^= line.startswith("```")
        if not fenced and re.match(r"#{1,6} ", line):
            depth = len(line) - len(line.lstrip("#"))
            line = "#" * min(6, depth + shift) + line[depth:]
        out.append(line)
    return "\n".join(out)


def results_page() -> str:
    text = (REPO / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")
    text = re.sub(r"\]\(results/gpu_check_[^)]*\.md\)", "](gpu.md)", text)  # the GPU report is a page of its own
    text = fix_links(text, REPO / "benchmarks", set())
    return ("# Benchmark results\n\nThe measured results kept in the repository (`benchmarks/RESULTS.md`, written by "
            "`benchmarks/report.py` from `benchmarks/results/*.json`); each table names the command that produced "
            "it and the machine it ran on.\n\n" + shift_headings(text, 2) + "\n")


def _without_title(text: str) -> tuple[str, str]:
    """A Markdown file's first-level title and the rest."""
    lines = text.strip().splitlines()
    if lines and lines[0].startswith("# "):
        return lines[0][2:].strip(), "\n".join(lines[1:]).strip()
    return "", text.strip()


def gpu_page() -> str:
    """Every GPU report of benchmarks/results (``gpu_check_<gpu>.md``), each after the note on where it comes
    from (``gpu_check_<gpu>.about.md``) when there is one."""
    reports = sorted(p for p in GPU_REPORTS.glob("gpu_check_*.md") if not p.name.endswith(".about.md"))
    head = ("# Measured on a GPU\n\n`scripts/gpu_check.sh`, run on a machine with a CUDA GPU, checks every CUDA path "
            "one GPU allows (`dpteach doctor --gpu`, then the tests marked `gpu` and `multigpu`) and writes its "
            "report to `benchmarks/results/gpu_check_<gpu>.md`. The lessons' outputs on this site come from CPU "
            "ranks (each page says where it ran); these are the numbers a GPU gave.\n\n")
    if not reports:
        return head + ("```{note}\nNo GPU report has been committed yet: `benchmarks/results/` holds no "
                       "`gpu_check_*.md`. Every output on this site comes from CPU ranks.\n```\n")
    parts = [head]
    for report in reports:
        title, body = _without_title(report.read_text(encoding="utf-8"))
        parts.append(f"## {title or report.stem}\n\nFrom `{report.relative_to(REPO)}`.\n")
        about = report.with_name(f"{report.stem}.about.md")
        if about.is_file():
            about_title, about_body = _without_title(about.read_text(encoding="utf-8"))
            parts.append("````{admonition} " + (about_title.replace("`", "") or "Where it comes from") + "\n"
                         + fix_links(about_body, GPU_REPORTS, set()) + "\n````\n")
        parts.append(shift_headings(fix_links(body, GPU_REPORTS, set()), 3) + "\n")
    return "\n".join(parts)


def home_page(lessons: list[Path], exercises: list[Path], topics: dict, bank, titles: dict) -> str:
    from dpteach import course
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    intro = readme.split("\n## ", 1)[0].split("\n", 1)[1].strip()  # the paragraph under the README's title
    by_number = {lesson.number: lesson for lesson in course.LESSONS}
    rows = ["| lesson | the question it answers by running it |", "|---|---|"]
    for path in lessons:
        lesson = by_number.get(path.stem[:2])
        question = lesson.question if lesson else ""
        rows.append(f"| [{titles[path]}](notebooks/{path.name}) | {question} |")
    exercise_rows = ["| exercise | what you write |", "|---|---|"]
    for path in exercises:
        what = titles[path].split(" - ", 1)[-1]
        exercise_rows.append(f"| [Exercise {path.stem[:2]}](exercises/{path.name}) | {what} |")
    quiz_rows = [f"* [{title}](quizzes/{topic}.md): {len(bank.topic(topic))} questions"
                 for topic, title in topics.items()]
    toc = lambda caption, entries: "\n".join(["```{toctree}", ":hidden:", f":caption: {caption}", ":maxdepth: 1", "",
                                              *entries, "```"])
    return "\n".join([
        "# dpteach: data-parallel training, taught by running it", "", intro, "",
        "This site is the whole course to read: every lesson and exercise with the outputs of a real run "
        "(each page says where and when it ran), every quiz question with its answer, and the measured "
        "benchmarks. To run it yourself: `pip install dpteach` then `dpteach lab`, or `make lab` from a clone.", "",
        "## Lessons", "", *rows, "", "## Exercises", "",
        "Notebooks you complete; they grade themselves on real ranks.", "", *exercise_rows, "",
        "## Quizzes", "", *quiz_rows, "", "## Measurements", "",
        "* [Benchmark results](results.md)", "* [Measured on a GPU](gpu.md)", "",
        toc("Lessons", [f"notebooks/{p.stem}" for p in lessons]),
        toc("Exercises", [f"exercises/{p.stem}" for p in exercises]),
        toc("Quizzes", ["quizzes/index"]),
        toc("Measurements", ["results", "gpu"]), ""])


def quiz_index(topics: dict, bank, lesson_names: dict) -> str:
    lines = ["# Quizzes", "", f"{len(bank.items)} questions in {len(topics)} topics, each with its answer "
             "and an explanation for every option. The practice exam of lesson 10 draws from all of them.", "",
             "| topic | questions | taught in |", "|---|---:|---|"]
    for topic, title in topics.items():
        items = bank.topic(topic)
        notebook = Path(items[0].notebook).stem if items else ""
        lines.append(f"| [{title}]({topic}.md) | {len(items)} | "
                     f"[{lesson_names.get(notebook, notebook)}](../notebooks/{notebook}.ipynb) |")
    lines += ["", "```{toctree}", ":hidden:", ":maxdepth: 1", "", *topics, "```", ""]
    return "\n".join(lines)


# -- the build ----------------------------------------------------------------------------------------

def check_stored(execute_stale: bool, notebook_timeout: int, cell_timeout: int, partial: bool) -> list[Path]:
    """The notebooks the site shows: all, once every stored run is up to date (running the stale ones first
    with ``execute_stale``); with ``partial``, only those whose stored run is."""
    problems = [(source, reason) for source in store.sources() if (reason := store.stale_reason(source))]
    if not problems:
        return store.sources()
    if partial:
        print(f"--partial: leaving out {len(problems)} notebook(s) with no up-to-date stored run: "
              + ", ".join(store.label(source) for source, _ in problems), flush=True)
        return [source for source in store.sources() if source not in dict(problems)]
    if not execute_stale:
        raise SystemExit(store.stale_message(problems))
    print(f"--execute-stale: running {len(problems)} notebook(s) whose stored run is stale or missing", flush=True)
    failures = store.execute([source for source, _ in problems], notebook_timeout, cell_timeout, gpu=False)
    if failures:
        raise SystemExit("\n".join(["could not refresh every stored run:", *failures]))
    return store.sources()


def write_pages(pages: Path, every: list[Path]) -> dict:
    """Write every page's source into ``pages`` (emptied first); return counts for the summary."""
    from dpteach.quiz import load_bank
    if pages.exists():
        shutil.rmtree(pages)
    (pages / "quizzes").mkdir(parents=True)
    bank = load_bank()
    topics = bank.topics
    lessons = [p for p in every if p.parent.name == "notebooks"]
    exercises = [p for p in every if p.parent.name == "exercises"]
    titles = {path: notebook_title(path) for path in every}
    lesson_names = {p.stem: titles[p] for p in lessons}
    page_files = {p.resolve() for p in every}
    counts = {"panels": 0, "quizzes": 0}
    for source in every:
        page, found = notebook_page(source, topics, page_files)
        (pages / source.parent.name).mkdir(exist_ok=True)
        (pages / source.parent.name / source.name).write_text(json.dumps(page, ensure_ascii=False), encoding="utf-8")
        for key in counts:
            counts[key] += found[key]
    for topic, title in topics.items():
        (pages / "quizzes" / f"{topic}.md").write_text(
            quiz_page(topic, title, bank.topic(topic), pages / "quizzes" / "figures",
                      {f"{stem}.ipynb": name for stem, name in lesson_names.items()}), encoding="utf-8")
    (pages / "quizzes" / "index.md").write_text(quiz_index(topics, bank, lesson_names), encoding="utf-8")
    (pages / "results.md").write_text(results_page(), encoding="utf-8")
    (pages / "gpu.md").write_text(gpu_page(), encoding="utf-8")
    (pages / "index.md").write_text(home_page(lessons, exercises, topics, bank, titles), encoding="utf-8")
    return {"lessons": len(lessons), "exercises": len(exercises), "topics": len(topics), **counts}


def run_sphinx(pages: Path, out: Path, strict: bool, jobs: str) -> int:
    command = [sys.executable, "-m", "sphinx", "-b", "html", "-c", str(HERE), "-q", "-j", jobs,
               *(["-W", "--keep-going"] if strict else []), str(pages), str(out)]
    return subprocess.run(command).returncode


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--execute", nargs="*", metavar="NAME",
                        help="run these notebooks (default: all) and store them in site/outputs/; build nothing")
    parser.add_argument("--execute-stale", action="store_true",
                        help="build, first running the notebooks whose stored run is stale or missing")
    parser.add_argument("--pages", type=Path, default=PAGES, help=f"where the page sources go (default {PAGES})")
    parser.add_argument("--out", type=Path, default=HTML_OUT, help=f"where the HTML goes (default {HTML_OUT})")
    parser.add_argument("--partial", action="store_true",
                        help="leave out the notebooks with no up-to-date stored run (for work on the site itself)")
    parser.add_argument("--strict", action="store_true", help="turn Sphinx warnings into errors (-W)")
    parser.add_argument("-j", "--jobs", default="auto", help="Sphinx's parallel jobs (default auto)")
    parser.add_argument("--notebook-timeout", type=int, default=store.NOTEBOOK_TIMEOUT_S,
                        help="seconds one notebook may run under --execute (default %(default)s)")
    parser.add_argument("--cell-timeout", type=int, default=store.CELL_TIMEOUT_S,
                        help="seconds one cell may run under --execute (default %(default)s)")
    parser.add_argument("--gpu", action="store_true",
                        help="--execute with the machine's GPUs visible (default: CPU-only, as the test suite)")
    args = parser.parse_args(argv)
    if args.execute is not None:
        failures = store.execute(store.resolve(args.execute), args.notebook_timeout, args.cell_timeout, args.gpu)
        for line in failures:
            print(f"FAILED {line}", file=sys.stderr)
        return 1 if failures else 0
    started = time.monotonic()
    shown = check_stored(args.execute_stale, args.notebook_timeout, args.cell_timeout, args.partial)
    counts = write_pages(args.pages.resolve(), shown)
    code = run_sphinx(args.pages.resolve(), args.out.resolve(), args.strict, args.jobs)
    if code == 0:
        print(f"site built in {time.monotonic() - started:.0f} s: {counts['lessons']} lessons, {counts['exercises']} "
              f"exercises, {counts['topics']} quiz topics ({counts['panels']} panels and {counts['quizzes']} quizzes "
              f"made static) -> {args.out.resolve() / 'index.html'}")
    return code


if __name__ == "__main__":
    sys.exit(main())
