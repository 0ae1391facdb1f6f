"""The page sources of the course's website: what ``build.py`` writes into ``site/_pages`` for Sphinx.

Pages: a home page (the course table of ``dpteach.course``), every lesson of ``notebooks/`` and exercise
of ``exercises/`` with the outputs of a real run, one page per quiz topic (read through ``dpteach.quiz``),
the benchmark results (``benchmarks/RESULTS.md``) and what was measured on a GPU
(``benchmarks/results/gpu_check_*.md``, written by ``scripts/gpu_check.sh``).

A notebook's page is its stored run (``site/execute.py``) with its widgets made static
(``static_widgets.py``), a Run-it box under its title that says where and when it ran, and its links to
repository files that are no page of the site turned into the file's path. Each function returns a
page's text (or notebook); none writes but ``quiz_page``, which copies its items' figures beside the page.
"""
from __future__ import annotations

import html
import re
import shutil
from pathlib import Path

import execute as store  # site/execute.py: the stored runs (build.py puts site/ on sys.path)
from compaction import META, WIDGET_STATE  # site/compaction.py: what a stored run keeps of its widgets
from static_widgets import NOTE, WidgetRenderer  # site/static_widgets.py

REPO = store.REPO
GPU_REPORTS = REPO / "benchmarks" / "results"


# -- notebook pages -----------------------------------------------------------------------------------

def run_it_box(source: Path, record: dict) -> str:
    relative = f"{source.parent.name}/{source.name}"
    machine, commit = record.get("machine", {}), record.get("dpteach", {})
    gpu = f"GPU {machine['gpu']}" if machine.get("gpu") else "no GPU"
    cpu_only = record.get("environment", {}).get("DPTEACH_GPUS") == "0"
    lines = ["```{admonition} Run it", ":class: tip",
             f"Installed with pip (`pip install dpteach`, or the wheel `python -m build` makes in a clone): "
             f"`dpteach lab`, then open `{relative}` in the workspace it "
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
    """Bank text as one line of HTML, its `code spans` as code, as the quiz widget shows it (line breaks kept)."""
    from dpteach.quiz.widget import marked
    return marked(value.strip()).replace("\n", "<br>")


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
        "benchmarks. To run it yourself: `pip install dpteach` (or the wheel `python -m build` makes in a clone) "
        "then `dpteach lab`, or `make lab` from a clone.", "",
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
