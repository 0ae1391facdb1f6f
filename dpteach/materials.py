"""Where the course's own files are: the lessons, the exercises and the quiz bank.

A learner has the course in one of two ways, and every part of the library finds its files here:

* **a clone of the repository.** ``notebooks/``, ``exercises/`` and ``quizzes/`` sit beside the
  ``dpteach`` package, and the learner works in the clone itself (``make lab``);
* **an installed wheel** (``pip install dpteach``). The wheel carries the same three folders inside the
  package, as ``dpteach/_course/`` (``setup.py`` copies them in when the wheel is built). They are the
  course as shipped, never edited in place: ``dpteach lab`` copies the lessons and exercises into a
  workspace of the learner's own (``dpteach/workspace.py``), and the quiz bank is read where it lies.

``$DPTEACH_COURSE`` names another folder with the same layout, and wins over both.
"""
from __future__ import annotations

import os
from pathlib import Path

COURSE_ENV_VAR = "DPTEACH_COURSE"
PACKAGE_DIR = Path(__file__).resolve().parent
PACKAGED = PACKAGE_DIR / "_course"  # inside an installed wheel
CLONE = PACKAGE_DIR.parent          # the repository, when the package is imported from a clone

# What the wheel carries, folder by folder: the file patterns, and what a learner's workspace gets of it.
SHIPPED = {
    "notebooks": ("*.ipynb",),
    "exercises": ("*.ipynb", "README.md"),
    "quizzes": ("*.yaml", "README.md", "figures/*"),
}
WORKSPACE_FOLDERS = ("notebooks", "exercises")  # the quiz bank is data the library reads, not a learner's file


def is_clone(folder: Path) -> bool:
    """True for a clone of the repository (it has the project file and the lessons beside the package)."""
    return (folder / "pyproject.toml").is_file() and (folder / "notebooks").is_dir()


def course_root() -> Path:
    """The folder holding ``notebooks/``, ``exercises/`` and ``quizzes/``: ``$DPTEACH_COURSE``, else the
    clone this package was imported from, else the copy inside the installed package."""
    override = os.environ.get(COURSE_ENV_VAR)
    if override:
        root = Path(override).expanduser()
        if not (root / "notebooks").is_dir():
            raise ValueError(f"{COURSE_ENV_VAR}={override!r} has no notebooks/ folder: it must name a folder "
                             f"laid out like the course (notebooks/, exercises/, quizzes/), or be unset")
        return root
    if is_clone(CLONE):
        return CLONE
    if (PACKAGED / "notebooks").is_dir():
        return PACKAGED
    raise ValueError(f"the course's notebooks are neither beside the package ({CLONE}) nor inside it "
                     f"({PACKAGED}): reinstall dpteach from its wheel, or set {COURSE_ENV_VAR} to a clone")


def installed() -> bool:
    """True when the course comes from an installed wheel rather than a clone (or ``$DPTEACH_COURSE``)."""
    return course_root() == PACKAGED


def quizzes_dir() -> Path:
    return course_root() / "quizzes"


def shipped_files(root: Path | None = None, folders=tuple(SHIPPED)) -> dict[str, Path]:
    """The course's files under ``root``, by their path relative to it (``notebooks/03_bucketing.ipynb``),
    for the folders asked for, sorted."""
    root = course_root() if root is None else root
    found = {}
    for folder in folders:
        for pattern in SHIPPED[folder]:
            for path in (root / folder).glob(pattern):
                if path.is_file() and not path.name.startswith("."):
                    found[path.relative_to(root).as_posix()] = path
    return dict(sorted(found.items()))
