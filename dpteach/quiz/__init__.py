"""Quizzes in the style of certification practice questions, each option explained, each answer shown live.

In a notebook::

    from dpteach import quiz
    quiz.show("overlap")            # every item of a topic
    quiz.show(["overlap-tail-bucket", "bucket-reverse-order"])
    panel = quiz.show(exam=10, seed=3)   # ten items across all topics
    panel.score, panel.results

In a terminal: ``dpteach quiz --topic overlap``; instructors check the bank with
``dpteach quiz --validate``. The bank lives in ``quizzes/<topic>.yaml`` (format: ``quizzes/README.md``).

Its modules, one line each (``scripts/package_faces.py`` writes this list from their docstrings):

* ``bank``: Load the quiz bank (``quizzes/<topic>.yaml``) and check it before any learner sees it.
* ``bank_checks``: The two layers of checking a quiz bank file (``bank.py`` reads the files and uses both).
* ``catalog``: What a quiz item may refer to: the course's topics, notebooks and experiments.
* ``scoring``: Which items a quiz session asks, in which option order, and whether an answer is right.
* ``terminal``: The quiz in a plain terminal: numbered options, answers typed as ``2`` or ``1,3``.
* ``widget``: The quiz as an ipywidgets panel inside a notebook: pick, submit, read why each option is right or
  wrong.
"""
from __future__ import annotations

from .bank import Bank, BankError, Item, Option, Problem, default_bank_dir, load_bank, validate_bank
from .catalog import EXPERIMENTS, NOTEBOOKS, topic_titles
from .scoring import pick_items, score_answers

__all__ = ["show", "QuizPanel", "load_bank", "validate_bank", "score_answers", "pick_items", "default_bank_dir",
           "Bank", "BankError", "Item", "Option", "Problem", "topic_titles", "NOTEBOOKS", "EXPERIMENTS"]


def show(what=None, seed: int = 0, *, exam: int | None = None, bank: Bank | None = None, store=None,
         record: bool = True):
    """Render quiz items in the notebook and return the :class:`QuizPanel`.

    ``what``: a topic id (all its items), an item id, or a list of item ids; or ``exam=N`` for N
    items drawn across topics. ``seed`` fixes the exam draw and the option order. Each submission
    is recorded in the progress store (``store``, default ``~/.dpteach/progress.json`` or
    ``$DPTEACH_PROGRESS``) unless ``record=False``.
    """
    from .widget import QuizPanel

    bank = bank if bank is not None else load_bank()
    items = pick_items(bank, what, exam=exam, seed=seed)
    if exam is not None:
        title = f"Practice exam: {len(items)} questions"
    elif isinstance(what, str) and what in bank.topics:
        title = f"Quiz: {bank.topics[what]}"
    else:
        title = "Quiz"
    return QuizPanel(items, seed=seed, store=store, record=record, title=title)


def __getattr__(name):  # QuizPanel without importing ipywidgets for terminal-only use
    if name == "QuizPanel":
        from .widget import QuizPanel
        return QuizPanel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
