"""Tables for ``notebooks/10_practice_exam.ipynb``: which notebook proves each answer, and the learner's progress.

Every row is read from the quiz bank (``demonstrated_by`` or ``explained_in``, and ``mirrors``, of each item) and from the
progress store, so the tables follow the bank when an instructor edits it.
"""
from __future__ import annotations

from html import escape
from pathlib import Path

from ..quiz.catalog import topic_titles
from .rendering import html_table


def mirror_rows(bank) -> list[dict]:
    """One row per item that mirrors a practice question, in the order of the practice material."""
    def order(item):
        source, _, number = item.mirrors.partition("#")
        return source, int(number) if number.isdigit() else 0
    return [{"id": item.id, "topic": item.topic, "topic_title": item.topic_title, "mirrors": item.mirrors,
             "notebook": item.notebook, "experiment": item.experiment, "section": item.section, "type": item.type}
            for item in sorted((i for i in bank.items if i.mirrors), key=order)]


def demonstrations(bank) -> list[dict]:
    """Every (notebook, experiment) pair the bank points to, with the items whose answer it shows."""
    pairs: dict[tuple[str, str], list[str]] = {}
    for item in bank.items:
        if item.demonstrated:
            pairs.setdefault((item.notebook, item.experiment), []).append(item.id)
    return [{"notebook": nb, "experiment": ex, "items": ids} for (nb, ex), ids in sorted(pairs.items())]


def explanations(bank) -> list[dict]:
    """Every (notebook, section) pair that explains what no run here can show, with its items."""
    pairs: dict[tuple[str, str], list[str]] = {}
    for item in bank.items:
        if not item.demonstrated:
            pairs.setdefault((item.notebook, item.section), []).append(item.id)
    return [{"notebook": nb, "section": sec, "items": ids} for (nb, sec), ids in sorted(pairs.items())]


def links_table(rows: list[dict], notebooks_dir: str | Path = "."):
    """Item -> the notebook (a link, relative to this notebook) and the experiment that shows its answer."""
    folder = Path(notebooks_dir)
    cells = []
    for row in rows:
        exists = (folder / row["notebook"]).exists()
        link = f'<a href="{escape(row["notebook"])}">{escape(row["notebook"])}</a>' if exists \
            else f'{escape(row["notebook"])} <i>(not in this checkout yet)</i>'
        shown_by = (f"<code>dpteach.experiments.{escape(row['experiment'])}</code>" if row["experiment"]
                    else f"explained in <i>{escape(row['section'])}</i>")
        cells.append([f"<code>{escape(row['id'])}</code>", escape(row["topic_title"]), link, shown_by])
    return html_table(["quiz item", "topic", "notebook that shows the answer", "experiment"], cells, align="llll")


def progress_table(summary: dict):
    """Quiz progress per topic (course order) and exercise grades, from ``ProgressStore().summary()``."""
    quiz = summary.get("quiz", {})
    rows = [[escape(title), quiz.get(topic, {}).get("answered", 0), quiz.get(topic, {}).get("correct", 0),
             quiz.get(topic, {}).get("attempts", 0)] for topic, title in topic_titles().items()]
    table = html_table(["topic", "items answered", "answered correctly at least once", "attempts"], rows,
                       align="lrrr")
    exercises = summary.get("exercises", {})
    if not exercises:
        return table, None
    ex_rows = [[escape(name), f"{e['best']:g} / {e['max']:g}" if e.get("max") else "-", e.get("attempts", 0),
                escape(str(e.get("status")))] for name, e in exercises.items()]
    return table, html_table(["exercise", "best score", "attempts", "last status"], ex_rows, align="lrrl")
