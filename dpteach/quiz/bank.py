"""Load the quiz bank (``quizzes/<topic>.yaml``) and check it before any learner sees it.

Instructors edit the bank by hand, so every mistake must come back as a sentence that names
the file, the item and what is wrong. Checking happens in two layers:

1. ``schema.json`` (shipped in this package) checks the shape: required fields, types, known
   lessons, notebooks and experiments (filled in from the course table, ``dpteach.course``), no
   unknown keys (a misspelt ``explanation`` is caught, not ignored);
2. what a schema cannot say: a single-answer item has exactly one correct option, a multiple-select
   item has exactly ``select`` correct ones, an item is either demonstrated by an experiment or
   explained in a notebook section (one of the two, never both), and a file holds the topic its name
   says (both layers: ``bank_checks.py``); ids and mirrors are unique across the whole bank (here).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import yaml

from .bank_checks import Problem, schema_problems, semantic_problems
from .catalog import default_bank_dir, topic_header, topic_order  # noqa: F401 (default_bank_dir: here too)


@dataclass(frozen=True)
class Option:
    text: str
    correct: bool
    explanation: str


@dataclass(frozen=True)
class Item:
    id: str
    topic: str
    topic_title: str  # the title its bank file gives the topic
    type: str  # "single" or "multiple"
    select: int  # how many options to pick: 1 for "single"
    stem: str
    options: tuple[Option, ...]
    trap: str
    notebook: str
    experiment: str | None  # the dpteach.experiments function that shows the answer live ...
    section: str | None  # ... or, for what no run here can show, the notebook section that explains it
    mirrors: str | None
    source: str  # the bank file it came from, for messages
    figure: dict | None = None  # a figure drawn from a real run's trace: image and trace paths (absolute), the run

    @property
    def demonstrated(self) -> bool:
        """True when a run shows the answer; False when the course can only explain it."""
        return self.experiment is not None

    @property
    def evidence(self) -> str:
        """Where the learner sees the answer, in words: the experiment, or the section that explains it."""
        if self.demonstrated:
            return f"notebook {self.notebook}, experiment dpteach.experiments.{self.experiment}"
        return f"notebook {self.notebook}, section \"{self.section}\" (explained there: a run here cannot show it)"

    @property
    def expected(self) -> list[str]:
        """Texts of the correct options, in bank order."""
        return [option.text for option in self.options if option.correct]


class BankError(ValueError):
    """The bank cannot be used; ``problems`` lists every reason, one per line in the message."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        super().__init__("\n".join(str(problem) for problem in self.problems))


# -- reading one file --------------------------------------------------------------------------

class _StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """YAML loader that refuses a key given twice (plain YAML silently keeps the last one). It parses with libyaml
    where PyYAML was built with it (about ten times faster: the whole bank is read each time a quiz is shown);
    the duplicate check is in the constructor, which is Python either way."""


def _mapping_without_duplicates(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} appears twice in the same mapping", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)
def _to_item(entry: dict, file: str, title: str) -> Item:
    shown, explained = entry.get("demonstrated_by"), entry.get("explained_in")
    return Item(
        id=entry["id"], topic=entry["topic"], topic_title=title, type=entry["type"], select=entry.get("select", 1),
        stem=entry["stem"].strip(),
        options=tuple(Option(o["text"].strip(), o["correct"], o["explanation"].strip()) for o in entry["options"]),
        trap=entry["trap"].strip(), notebook=(shown or explained)["notebook"],
        experiment=shown["experiment"] if shown else None, section=explained["section"].strip() if explained else None,
        mirrors=entry.get("mirrors"), source=file, figure=_figure(entry, file),
    )


def _figure(entry: dict, file: str) -> dict | None:
    """The item's figure with its files' paths made absolute (they are relative to the bank's folder)."""
    figure, folder = entry.get("figure"), Path(file).parent
    return None if figure is None else {**figure, "image": str(folder / figure["image"]),
                                        "trace": str(folder / figure["trace"])}


def read_bank_file(path: Path) -> tuple[list[Item], list[Problem]]:
    """Items of one bank file and the problems found in it (items only when there are none)."""
    file = str(path)
    topic = path.stem
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_StrictLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        return [], [Problem(file, None, f"cannot be read as YAML: {exc}")]
    problems = schema_problems(data, file)
    if not problems:
        problems = semantic_problems(data, file, topic)
    if problems:
        return [], problems
    return [_to_item(entry, file, data["title"].strip()) for entry in data["items"]], []


# -- the whole bank ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Bank:
    """All items, in course order (topics by the lesson that teaches them, then file order)."""
    folder: Path
    items: tuple[Item, ...]

    @property
    def topics(self) -> dict:
        """``{topic: title}`` in course order."""
        return {item.topic: item.topic_title for item in self.items}

    def get(self, item_id: str) -> Item:
        for item in self.items:
            if item.id == item_id:
                return item
        raise ValueError(f"no quiz item with id {item_id!r} in {self.folder}")

    def topic(self, topic: str) -> list[Item]:
        if topic not in self.topics:
            raise ValueError(f"topic {topic!r} is not a course topic; choose one of {', '.join(self.topics)}")
        return [item for item in self.items if item.topic == topic]

    def exam(self, count: int, seed: int = 0) -> list[Item]:
        """``count`` distinct items drawn across all topics; the same seed draws the same exam."""
        if not 1 <= count <= len(self.items):
            raise ValueError(f"exam size {count} is not possible: choose between 1 and {len(self.items)} items")
        return random.Random(seed).sample(list(self.items), count)


def check_bank(folder: Path | str | None = None) -> tuple[list[Item], list[Problem]]:
    """Every item of the bank folder, and every problem in it (including across files)."""
    folder = Path(folder) if folder is not None else default_bank_dir()
    if not folder.is_dir():
        return [], [Problem(str(folder), None, "quiz bank folder does not exist")]
    paths = sorted(folder.glob("*.yaml"), key=lambda p: topic_order(p.stem, str(topic_header(p).get("lesson", ""))))
    if not paths:
        return [], [Problem(str(folder), None, "quiz bank folder holds no <topic>.yaml file")]
    items, problems = [], []
    for path in paths:
        file_items, file_problems = read_bank_file(path)
        items += file_items
        problems += file_problems
    first_seen: dict[tuple[str, str], Item] = {}
    for item in items:
        for kind, key in (("id", item.id), ("mirrors", item.mirrors)):
            if key is None:
                continue
            if (kind, key) in first_seen:
                other = first_seen[(kind, key)]
                problems.append(Problem(item.source, item.id, f"{kind} {key!r} is already used by item {other.id!r} in {other.source}"))
            else:
                first_seen[(kind, key)] = item
    return items, problems


def validate_bank(folder: Path | str | None = None) -> list[Problem]:
    """The problems of the bank folder; an empty list means it is ready to use."""
    return check_bank(folder)[1]


def load_bank(folder: Path | str | None = None) -> Bank:
    """The bank, or :class:`BankError` naming every file, item and problem."""
    folder = Path(folder) if folder is not None else default_bank_dir()
    items, problems = check_bank(folder)
    if problems:
        raise BankError(problems)
    return Bank(folder, tuple(items))
