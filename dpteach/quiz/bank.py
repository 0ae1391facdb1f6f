"""Load the quiz bank (``quizzes/<topic>.yaml``) and check it before any learner sees it.

Instructors edit the bank by hand, so every mistake must come back as a sentence that names
the file, the item and what is wrong. Checking happens in two layers:

1. ``schema.json`` (shipped in this package) checks the shape: required fields, types, known
   lessons, notebooks and experiments (filled in from the course table, ``dpteach.course``), no
   unknown keys (a misspelt ``explanation`` is caught, not ignored);
2. :func:`_check_semantics` checks what a schema cannot say: a single-answer item has exactly one
   correct option, a multiple-select item has exactly ``select`` correct ones, an item is either
   demonstrated by an experiment or explained in a notebook section (one of the two, never both),
   ids and mirrors are unique across the whole bank, and a file holds the topic its name says.
"""
from __future__ import annotations

import functools
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from .catalog import EXPERIMENTS, NOTEBOOKS, default_bank_dir, topic_header, topic_order  # noqa: F401 (default_bank_dir: here too)
from ..course import LESSONS, experiment_homes

SCHEMA_PATH = Path(__file__).with_name("schema.json")


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


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a bank file; ``str()`` is the sentence shown to the instructor."""
    file: str
    item: str | None
    message: str

    def __str__(self) -> str:
        where = f"{self.file}: item {self.item!r}" if self.item else self.file
        return f"{where}: {self.message}"


class BankError(ValueError):
    """The bank cannot be used; ``problems`` lists every reason, one per line in the message."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        super().__init__("\n".join(str(problem) for problem in self.problems))


# -- reading one file --------------------------------------------------------------------------

class _StrictLoader(yaml.SafeLoader):
    """YAML loader that refuses a key given twice (plain YAML silently keeps the last one)."""


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
def _schema() -> dict:
    """``schema.json`` with its lists of lessons, notebooks and experiments taken from the course table."""
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    schema["$defs"]["lesson"]["enum"] = [lesson.number for lesson in LESSONS]
    schema["$defs"]["notebook"]["enum"] = list(NOTEBOOKS)
    schema["$defs"]["experiment"]["enum"], schema["$defs"]["runnable"]["enum"] = list(EXPERIMENTS), list(experiment_homes())
    return schema


@functools.cache
def _validator():
    """The schema's validator, built on first use. jsonschema is imported here, and without one optional
    package: when ``rfc3987_syntax`` is installed (Jupyter's own dependencies bring it), jsonschema's format
    module imports it to check the "iri" format, and it builds its grammar at import - about 1.5 s of a
    laptop core, in every lesson that shows a quiz. The bank's schema checks no format, and jsonschema
    skips a format checker whose package cannot be imported (``jsonschema/_format.py``); a process that
    imported jsonschema before keeps what it has."""
    optional = "rfc3987_syntax"
    block = optional not in sys.modules and "jsonschema" not in sys.modules
    if block:
        sys.modules[optional] = None  # `import rfc3987_syntax` raises ModuleNotFoundError while this is here
    try:
        import jsonschema
    finally:
        if block and sys.modules.get(optional, 0) is None:
            del sys.modules[optional]
    return jsonschema.Draft202012Validator(_schema())


def _item_label(data, index: int) -> str:
    """The item's id for messages, or its position when the id itself is missing or broken."""
    items = data.get("items") if isinstance(data, dict) else None
    if isinstance(items, list) and index < len(items):
        entry = items[index]
        if isinstance(entry, dict) and isinstance(entry.get("id"), str) and entry["id"].strip():
            return entry["id"]
    return f"#{index + 1} (no usable id)"


# What a failed "pattern" means, in words; jsonschema would only quote the regular expression.
_PATTERN_MEANING = {
    "id": "ids use lowercase letters, digits, '-' and '_', e.g. 'overlap-tail-bucket'",
    "mirrors": "must be '<seed file name>#<question number>', e.g. '004_80bd7ec0000ca684.txt#5'",
}


def _say(error) -> str:
    if error.validator == "pattern":
        field = next((p for p in reversed(error.absolute_path) if isinstance(p, str)), "")
        return f"{error.instance!r}: {_PATTERN_MEANING.get(field, 'must not be empty')}"
    return error.message


def _schema_problems(data, file: str) -> list[Problem]:
    problems = []
    for error in sorted(_validator().iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path]):
        path = list(error.absolute_path)
        if len(path) >= 2 and path[0] == "items" and isinstance(path[1], int):
            field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path[2:]).lstrip(".")
            message = f"{field}: {_say(error)}" if field else _say(error)
            problems.append(Problem(file, _item_label(data, path[1]), message))
        else:
            field = ".".join(str(p) for p in path)
            problems.append(Problem(file, None, f"{field}: {_say(error)}" if field else _say(error)))
    return problems


def _check_semantics(data: dict, file: str, topic: str) -> list[Problem]:
    problems = []
    if data["topic"] != topic:
        problems.append(Problem(file, None, f"topic is {data['topic']!r} but the file name says {topic!r}"))
    for entry in data["items"]:
        def complain(message, item_id=entry["id"]):
            problems.append(Problem(file, item_id, message))

        if entry["topic"] != topic:
            complain(f"topic is {entry['topic']!r} but it sits in the file for topic {topic!r}")
        evidence = [key for key in ("demonstrated_by", "explained_in") if key in entry]
        if len(evidence) != 1:
            complain("needs exactly one of 'demonstrated_by' (the experiment whose run shows the answer) and "
                     f"'explained_in' (the notebook section that explains it); found {evidence or 'neither'}")
        n_correct = sum(option["correct"] for option in entry["options"])
        if entry["type"] == "single":
            if "select" in entry:
                complain("'select' only applies to type 'multiple' (a single-answer item picks one)")
            if n_correct != 1:
                complain(f"type 'single' needs exactly 1 correct option, found {n_correct}")
        elif "select" not in entry:
            complain("type 'multiple' needs 'select': how many options the learner must pick")
        else:
            if n_correct != entry["select"]:
                complain(f"'select' is {entry['select']} but {n_correct} options are marked correct")
            if entry["select"] >= len(entry["options"]):
                complain(f"'select' is {entry['select']} but there are only {len(entry['options'])} options")
        for key in ("image", "trace") if "figure" in entry else ():
            if not (Path(file).parent / entry["figure"][key]).is_file():
                complain(f"its figure's {key} {entry['figure'][key]!r} is not in the bank's folder "
                         f"(scripts/quiz_figures.py makes it)")
        texts = [option["text"].strip().lower() for option in entry["options"]]
        if len(set(texts)) != len(texts):
            complain("two options have the same text (answers are matched by text, so each must differ)")
    return problems


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
    problems = _schema_problems(data, file)
    if not problems:
        problems = _check_semantics(data, file, topic)
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
