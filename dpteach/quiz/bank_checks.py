"""The two layers of checking a quiz bank file (``bank.py`` reads the files and uses both).

1. The shape, by ``schema.json`` (shipped in this package): required fields, types, known lessons,
   notebooks and experiments (filled in from the course table, ``dpteach.course``), no unknown keys (a
   misspelt ``explanation`` is caught, not ignored). ``schema_problems`` says each failure as a sentence
   that names the item and the field.
2. What a schema cannot say (``semantic_problems``): a single-answer item has exactly one correct option,
   a multiple-select item exactly ``select`` correct ones, an item is demonstrated by an experiment or
   explained in a notebook section (one of the two), its figure's files exist, its options differ, and a
   file holds the topic its name says.
"""
from __future__ import annotations

import functools
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from .catalog import EXPERIMENTS, NOTEBOOKS
from ..course import LESSONS, experiment_homes

SCHEMA_PATH = Path(__file__).with_name("schema.json")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a bank file; ``str()`` is the sentence shown to the instructor."""
    file: str
    item: str | None
    message: str

    def __str__(self) -> str:
        where = f"{self.file}: item {self.item!r}" if self.item else self.file
        return f"{where}: {self.message}"


def course_schema() -> dict:
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
    return jsonschema.Draft202012Validator(course_schema())


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


def schema_problems(data, file: str) -> list[Problem]:
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


def semantic_problems(data: dict, file: str, topic: str) -> list[Problem]:
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
