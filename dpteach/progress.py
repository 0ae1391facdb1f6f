"""The learner's progress through the course: quiz answers, exercise grades and predictions, in one JSON file.

Quizzes (``dpteach.quiz``) and the exercise grader (``dpteach.grading``) both write here, often from
two processes at once (a notebook kernel and a terminal), so the file is handled with care:

* every change is a read-modify-write under an exclusive lock (``fcntl.flock`` on a ``.lock`` file
  beside it), so two writers never lose each other's results;
* the new content goes to a temporary file in the same folder, is fsync'ed, then ``os.replace``'d
  over the old one, so a crash leaves either the old or the new file, never half of one;
* a file that cannot be parsed is never silently dropped: it is moved aside to
  ``progress.json.corrupt-<timestamp>`` and a :class:`ProgressFileWarning` says where.

Location: ``$DPTEACH_PROGRESS`` if set; else, in a course workspace (a folder that ``dpteach lab`` prepared,
marked by ``.dpteach/workspace.json``, or any folder below it), that workspace's ``.dpteach/progress.json``,
so two learners' workspaces on one account keep two records; else ``~/.dpteach/progress.json``. Grading
someone else's submission never writes here (``dpteach grade --submission``, the Gradescope autograder,
nbgrader's runs: ``dpteach/grading/__init__.py``).

API: ``ProgressStore(path=None)`` with ``record_quiz``, ``record_exercise``, ``record_prediction``, ``load``
and ``summary``.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
import warnings
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no flock; a single writer at a time is then the learner's job
    fcntl = None

PROGRESS_ENV_VAR = "DPTEACH_PROGRESS"
FORMAT_VERSION = 1


class ProgressFileWarning(UserWarning):
    """The progress file was unreadable and has been moved aside (the message says where)."""


def default_progress_path(folder: Path | None = None) -> Path:
    """Where progress is kept when no path is given: ``$DPTEACH_PROGRESS``, else the workspace that ``folder``
    (the working directory: a notebook's kernel runs in the notebook's folder) lies in, else the home folder."""
    override = os.environ.get(PROGRESS_ENV_VAR)
    if override:
        return Path(override).expanduser()
    here = Path(folder) if folder is not None else Path.cwd()
    for candidate in (here, *here.parents):
        if (candidate / WORKSPACE_MARK).is_file():
            return candidate / ".dpteach" / "progress.json"
    return Path.home() / ".dpteach" / "progress.json"


WORKSPACE_MARK = Path(".dpteach") / "workspace.json"  # written by dpteach.workspace.prepare


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _empty() -> dict:
    return {"version": FORMAT_VERSION, "quiz": {}, "exercises": {}, "predictions": {}}


class ProgressStore:
    """Read and update one progress file; every method is safe to call from several processes."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path).expanduser() if path is not None else default_progress_path()

    def __repr__(self) -> str:
        return f"ProgressStore({str(self.path)!r})"

    # -- the API ------------------------------------------------------------------------------

    def record_quiz(self, item_id: str, topic: str, correct: bool, chosen: list[str]) -> dict:
        """Record one submitted answer; returns the item's updated entry."""
        if not isinstance(item_id, str) or not item_id:
            raise ValueError(f"item_id must be a non-empty string, got {item_id!r}")
        if not isinstance(correct, bool):
            raise ValueError(f"correct must be True or False, got {correct!r}")
        if isinstance(chosen, str) or not all(isinstance(text, str) for text in chosen):
            raise ValueError(f"chosen must be a list of option texts, got {chosen!r}")

        def change(data):
            now = _now()
            entry = data["quiz"].setdefault(item_id, {"attempts": 0, "ever_correct": False, "first_answered": now})
            entry.update(topic=topic, attempts=entry["attempts"] + 1, last_correct=correct,
                         ever_correct=entry["ever_correct"] or correct, last_chosen=list(chosen),
                         last_answered=now)
            return entry

        return self._update(change)

    def record_exercise(self, exercise: str, score: float, max_score: float, status: str) -> dict:
        """Record one graded attempt (``status`` e.g. ``"passed"``, ``"failed"``, ``"error"``)."""
        if not isinstance(exercise, str) or not exercise:
            raise ValueError(f"exercise must be a non-empty string, got {exercise!r}")
        if not isinstance(max_score, (int, float)) or isinstance(max_score, bool) or max_score <= 0:
            raise ValueError(f"max_score must be a positive number, got {max_score!r}")
        if not isinstance(score, (int, float)) or isinstance(score, bool) or not 0 <= score <= max_score:
            raise ValueError(f"score must be a number between 0 and max_score={max_score}, got {score!r}")
        if not isinstance(status, str) or not status:
            raise ValueError(f"status must be a non-empty string, got {status!r}")

        def change(data):
            now = _now()
            entry = data["exercises"].setdefault(exercise, {"attempts": 0, "best_score": score, "first_attempt": now})
            entry.update(attempts=entry["attempts"] + 1, best_score=max(entry["best_score"], score),
                         max_score=max_score, last_score=score, last_status=status, last_attempt=now)
            return entry

        return self._update(change)

    def record_prediction(self, key: str, lesson: str, predicted: float, measured: float, unit: str) -> dict:
        """Record one prediction checked against a run (``key`` names the question); returns its entry, whose
        ``last_error`` is (predicted - measured) / measured and ``best_error`` the smallest in size so far."""
        if not isinstance(key, str) or not key:
            raise ValueError(f"key={key!r} is not allowed: give a non-empty string")
        for name, value in (("predicted", predicted), ("measured", measured)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
                raise ValueError(f"{name}={value!r} is not allowed: it must be a number")
        if measured == 0:
            raise ValueError("measured=0 is not allowed: a relative error needs a measured value other than 0")
        error = (predicted - measured) / measured

        def change(data):
            now = _now()
            entry = data["predictions"].setdefault(key, {"attempts": 0, "best_error": error, "first_attempt": now})
            best = min(entry["best_error"], error, key=abs)
            entry.update(lesson=lesson, unit=unit, attempts=entry["attempts"] + 1, last_predicted=predicted,
                         last_measured=measured, last_error=error, best_error=best, last_attempt=now)
            return entry

        return self._update(change)

    def load(self) -> dict:
        """The whole store: ``{"version", "quiz": {item id: entry}, "exercises": {name: entry}}``."""
        with self._locked():
            return self._read()

    def summary(self) -> dict:
        """Per topic: items answered and items answered correctly at least once (plus attempts);
        per exercise: best score, max score, attempts and last status; per prediction: its lesson, attempts,
        and the last and best relative errors."""
        data = self.load()
        topics: dict[str, dict] = {}
        for entry in data["quiz"].values():
            row = topics.setdefault(entry.get("topic") or "unknown", {"answered": 0, "correct": 0, "attempts": 0})
            row["answered"] += 1
            row["correct"] += bool(entry.get("ever_correct"))
            row["attempts"] += entry.get("attempts", 0)
        exercises = {name: {"best": entry.get("best_score"), "max": entry.get("max_score"),
                            "attempts": entry.get("attempts", 0), "status": entry.get("last_status")}
                     for name, entry in data["exercises"].items()}
        predictions = {key: {"lesson": entry.get("lesson"), "attempts": entry.get("attempts", 0),
                             "last_error": entry.get("last_error"), "best_error": entry.get("best_error")}
                       for key, entry in data["predictions"].items()}
        return {"quiz": dict(sorted(topics.items())), "exercises": dict(sorted(exercises.items())),
                "predictions": dict(sorted(predictions.items()))}

    # -- file handling ------------------------------------------------------------------------

    @contextmanager
    def _locked(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            if fcntl is not None:
                fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                if fcntl is not None:
                    fcntl.flock(lock, fcntl.LOCK_UN)

    def _update(self, change):
        with self._locked():
            data = self._read()
            result = change(data)
            self._write(data)
            return dict(result)

    def _read(self) -> dict:
        """The current content; call with the lock held (a corrupt file is moved aside)."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return _empty()
        try:
            data = json.loads(text)
            if not isinstance(data, dict):
                raise ValueError(f"top level is a {type(data).__name__}, not an object")
            for section in ("quiz", "exercises", "predictions"):
                if not isinstance(data.setdefault(section, {}), dict):
                    raise ValueError(f"'{section}' is not an object")
        except ValueError as exc:  # json.JSONDecodeError is a ValueError too
            self._set_aside(exc)
            return _empty()
        data.setdefault("version", FORMAT_VERSION)
        return data

    def _set_aside(self, reason: Exception) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        destination = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        counter = 1
        while destination.exists():
            destination = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{counter}")
            counter += 1
        os.replace(self.path, destination)
        warnings.warn(f"progress file {self.path} could not be read ({reason}); it was moved to "
                      f"{destination} and a fresh progress file is started", ProgressFileWarning, stacklevel=4)

    def _write(self, data: dict) -> None:
        write_text_atomically(self.path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def write_text_atomically(path, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader sees the old file or the new one, never a part: a
    temporary file in the same folder, fsync'ed, then renamed over the old (and the rename made durable)."""
    path = Path(path)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    if hasattr(os, "O_DIRECTORY"):
        directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
