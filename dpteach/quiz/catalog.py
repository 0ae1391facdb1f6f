"""What a quiz item may refer to: the course's topics, notebooks and experiments.

These names are the contract between the quiz bank and the rest of the course, and none is written
here: notebooks and experiments come from the course table (``dpteach.course``), and topics from the
bank itself - each topic is one file, ``quizzes/<topic>.yaml``, whose header gives its title and the
lesson that teaches it. Adding a topic is adding that file. An item says either which notebook and
which experiment show its answer live (``demonstrated_by``), or, where no run on this machine can show
it (NCCL's internals, a cluster's network), which notebook section explains it (``explained_in``);
the bank's checks (``bank.py``) fill ``schema.json``'s lists from here, so a typo in a bank file is
caught long before a learner clicks a link to a notebook that does not exist.
"""
from __future__ import annotations

import os
from pathlib import Path

import yaml

from .. import course, materials

NOTEBOOKS = course.notebooks()
EXPERIMENTS = course.experiments()
BANK_ENV_VAR = "DPTEACH_QUIZZES"


def default_bank_dir() -> Path:
    """``$DPTEACH_QUIZZES`` if set, else the course's ``quizzes/`` (the clone's, or the installed package's)."""
    override = os.environ.get(BANK_ENV_VAR)
    return Path(override) if override else materials.quizzes_dir()


def topic_header(path: Path) -> dict:
    """The keys above ``items:`` of a bank file (``topic``, ``title``, ``lesson``), without reading its items;
    an empty dict when the header cannot be read (the full check then says why)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return {}
    head = text.split("\nitems:", 1)[0]
    try:
        header = yaml.safe_load(head)
    except yaml.YAMLError:
        return {}
    return header if isinstance(header, dict) else {}


def topic_order(topic: str, lesson: str | None) -> tuple:
    """Course order: by the lesson that teaches the topic, then by name (a topic with no known lesson last)."""
    numbers = [entry.number for entry in course.LESSONS]
    return (numbers.index(lesson) if lesson in numbers else len(numbers), topic)


def topic_titles(folder: Path | str | None = None) -> dict:
    """``{topic: title}`` for the bank files in ``folder`` (default: the course's bank), in course order."""
    folder = Path(folder) if folder is not None else default_bank_dir()
    headers = {path.stem: topic_header(path) for path in folder.glob("*.yaml")}
    order = sorted(headers, key=lambda t: topic_order(t, str(headers[t].get("lesson", ""))))
    return {topic: str(headers[topic].get("title") or topic) for topic in order}


def lesson_topics(folder: Path | str | None = None) -> dict:
    """``{lesson number: [topics it teaches]}``, from the bank files' headers."""
    folder = Path(folder) if folder is not None else default_bank_dir()
    taught: dict = {}
    for topic in topic_titles(folder):
        lesson = str(topic_header(folder / f"{topic}.yaml").get("lesson", ""))
        taught.setdefault(lesson, []).append(topic)
    return taught


def __getattr__(name: str):
    if name == "TOPICS":  # the course bank's topics, read when asked (the bank folder may be set by then)
        return topic_titles()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
