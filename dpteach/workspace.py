"""A learner's own copy of the course, for a course installed with pip.

The package holds the course as shipped (``materials.py``); a learner edits copies. ``dpteach lab``
opens a workspace - ``~/dpteach-course`` unless ``--workspace`` or ``$DPTEACH_WORKSPACE`` names another -
laid out like the repository (``notebooks/``, ``exercises/``), so every link between lessons and
exercises works. Three rules:

1. **A file that is there is never overwritten by opening the lab.** The first ``dpteach lab`` copies
   every lesson and exercise in; later ones copy only what is missing (a lesson a newer dpteach added, a
   file the learner deleted).
2. **The workspace remembers what it was given.** ``.dpteach/workspace.json`` keeps, for each file, the
   fingerprint of the version copied. A notebook's fingerprint is its cells' kinds and text: running a
   lesson changes its outputs, execution counts and metadata, and that is not an edit. So the workspace
   can tell apart *edited* (the learner's cells differ from what was given) and *newer in the package*
   (the package's cells differ from what was given), and both can be true.
3. **A file is replaced only on request** (``dpteach workspace update`` / ``restore``), after the old file
   is kept under ``.dpteach/backups/``, and an exercise keeps the learner's solution cells: the new
   version's cells with the learner's code where the solution goes.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

from . import materials
from .progress import write_text_atomically

WORKSPACE_ENV_VAR = "DPTEACH_WORKSPACE"
DEFAULT_FOLDER = "dpteach-course"
STATE = Path(".dpteach") / "workspace.json"
BACKUPS = Path(".dpteach") / "backups"


HOME_ENV_VAR = "DPTEACH_HOME"  # where dpteach keeps what is the learner's and no workspace's (default ~/.dpteach)
LAST_CHOSEN = "last_workspace"  # the workspace `dpteach lab --workspace` or `dpteach workspace init` last opened


def _record() -> Path:
    return Path(os.environ.get(HOME_ENV_VAR) or Path.home() / ".dpteach").expanduser() / LAST_CHOSEN


def remember(workspace: Path) -> None:
    """Keep ``workspace`` as the one the learner chose last, so that a later command without ``--workspace``
    finds it (a learner who typed ``dpteach lab --workspace ~/course`` expects ``dpteach workspace`` to mean it).
    A home folder that cannot be written only loses the convenience."""
    try:
        _record().parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(_record(), f"{Path(workspace).expanduser().resolve()}\n")
    except OSError:
        pass


def last_chosen() -> Path | None:
    """The workspace remembered by :func:`remember`, if it is still a workspace."""
    try:
        folder = Path(_record().read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None
    return folder if (folder / STATE).is_file() else None


def default_workspace() -> Path:
    """``$DPTEACH_WORKSPACE``, else the workspace the learner last chose, else ``~/dpteach-course``."""
    return workspace_and_why()[0]


def workspace_and_why() -> tuple[Path, str]:
    """The default workspace and, in words, why it is the one (what ``dpteach workspace`` says it uses)."""
    if os.environ.get(WORKSPACE_ENV_VAR):
        return Path(os.environ[WORKSPACE_ENV_VAR]).expanduser(), f"${WORKSPACE_ENV_VAR}"
    chosen = last_chosen()
    if chosen is not None:
        return chosen, "the one you chose last, with `dpteach lab --workspace` or `dpteach workspace init`"
    return Path.home() / DEFAULT_FOLDER, "the default"


def notebook_fingerprint(notebook: dict) -> str:
    """A notebook's content: its cells' kinds and sources, in order (not outputs, ids or metadata). The
    site's stored runs (``site/execute.py``) are matched to their notebooks by the same fingerprint."""
    cells = [[cell["cell_type"], cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])]
             for cell in notebook["cells"]]
    return "sha256:" + hashlib.sha256(json.dumps(cells, ensure_ascii=False).encode("utf-8")).hexdigest()


def fingerprint(path: Path) -> str:
    """What counts as the content of a course file: a notebook's cells, else its bytes."""
    data = path.read_bytes()
    if path.suffix == ".ipynb":
        try:
            return notebook_fingerprint(json.loads(data))
        except (ValueError, KeyError, TypeError):
            pass  # not a notebook we can read: its bytes are its content
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _read_state(workspace: Path) -> dict:
    path = workspace / STATE
    if not path.is_file():
        return {"format": 1, "files": {}}
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(state.get("files"), dict):
            raise ValueError("no 'files' table")
        return state
    except ValueError as exc:
        raise ValueError(f"the workspace's record {path} cannot be read ({exc}); move it away and run "
                         f"dpteach lab again: files that are there are kept, as always") from None


def _write_state(workspace: Path, state: dict) -> None:
    (workspace / STATE).parent.mkdir(parents=True, exist_ok=True)
    state["course_version"] = _version()
    write_text_atomically(workspace / STATE, json.dumps(state, indent=1, sort_keys=True) + "\n")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("dpteach")
    except PackageNotFoundError:  # imported from a clone that was never installed
        return "unknown"


def prepare(workspace: Path, root: Path | None = None) -> dict:
    """Copy into ``workspace`` every course file it lacks; touch no file that is there.

    Returns ``{"workspace", "copied": [...], "kept": [...], "newer": [...]}`` (paths relative to the
    workspace; ``newer``: files the package has a newer version of, for ``dpteach workspace update``)."""
    workspace = Path(workspace).expanduser().resolve()
    if workspace.exists() and not workspace.is_dir():
        raise ValueError(f"workspace={str(workspace)!r} is a file: give a folder (new or one dpteach lab made)")
    shipped = materials.shipped_files(root, materials.WORKSPACE_FOLDERS)
    state = _read_state(workspace)
    copied, kept = [], []
    for rel, source in shipped.items():
        target = workspace / rel
        if target.exists():
            kept.append(rel)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(target, source.read_text(encoding="utf-8"))
        state["files"][rel] = {"given": fingerprint(source)}
        copied.append(rel)
    if copied:
        _write_state(workspace, state)
    newer = [rel for rel, source in shipped.items() if _newer(source, state["files"].get(rel, {}).get("given"))]
    return {"workspace": str(workspace), "copied": copied, "kept": kept, "newer": newer}


def choose(workspace: Path) -> dict:
    """The learner opens ``workspace`` (``dpteach lab --workspace``, ``dpteach workspace init``): :func:`prepare` it,
    and :func:`remember` it for the commands that name no workspace. Returns what ``prepare`` returns."""
    ready = prepare(workspace)
    remember(Path(ready["workspace"]))
    return ready


def _newer(source: Path, given: str | None) -> bool:
    """The package's version of a file differs from the version the workspace was given."""
    return given is not None and fingerprint(source) != given


def status(workspace: Path, root: Path | None = None) -> list[dict]:
    """One row per course file: ``path``, ``edited`` (its cells differ from what it was given), ``newer``
    (the package's version differs from what it was given), ``missing`` and ``state`` in words."""
    workspace = Path(workspace).expanduser().resolve()
    shipped = materials.shipped_files(root, materials.WORKSPACE_FOLDERS)
    files = _read_state(workspace)["files"]
    rows = []
    for rel, source in shipped.items():
        target, given = workspace / rel, files.get(rel, {}).get("given")
        missing = not target.exists()
        edited = not missing and given is not None and fingerprint(target) != given
        newer = _newer(source, given)
        if given is None and not missing:  # there before the workspace knew it: compare with the package
            edited = fingerprint(target) != fingerprint(source)
        words = ("missing (dpteach lab copies it)" if missing else
                 "edited, and newer in the package" if edited and newer else
                 "edited" if edited else "newer in the package" if newer else "as shipped")
        rows.append({"path": rel, "edited": edited, "newer": newer, "missing": missing, "state": words})
    return rows


def resolve(workspace: Path, name: str, root: Path | None = None) -> str:
    """The course file ``name`` means: a path in the workspace, a file name, or a stem prefix (``03``,
    ``exercises/03``, ``03_bucketing``)."""
    shipped = materials.shipped_files(root, materials.WORKSPACE_FOLDERS)
    text = name.replace("\\", "/").removeprefix("./")
    if text in shipped:
        return text
    matches = [rel for rel in shipped if rel.split("/")[-1] == text or rel.split("/")[-1].startswith(text)
               or rel.startswith(text)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise ValueError(f"NAME {name!r} is not a course file: give one of `dpteach workspace`'s paths, e.g. "
                         f"{next(iter(shipped))!r}, or a unique start of its name such as '03'")
    raise ValueError(f"NAME {name!r} matches {len(matches)} files ({', '.join(matches)}): give the path")


def carry_solutions(old: dict, new: dict) -> tuple[dict, int]:
    """``new`` (a notebook) with the solution cells' sources taken from ``old``; returns it and how many.

    A solution cell is one tagged ``solution``. Cells pair by nbgrader's ``grade_id`` where both have one,
    then by cell id, and the cells still unpaired in the order they come."""
    def solutions(notebook):
        return [c for c in notebook["cells"] if "solution" in c.get("metadata", {}).get("tags", [])]

    theirs, ours = solutions(old), solutions(new)
    pairs, free = {}, list(range(len(theirs)))
    for key in (lambda c: c.get("metadata", {}).get("nbgrader", {}).get("grade_id"), lambda c: c.get("id")):
        for i, cell in enumerate(ours):
            match = next((j for j in free if key(cell) is not None and key(theirs[j]) == key(cell)), None)
            if i not in pairs and match is not None:
                pairs[i] = match
                free.remove(match)
    for i in range(len(ours)):
        if i not in pairs and free:
            pairs[i] = free.pop(0)
    if free:
        raise ValueError(f"the new version has {len(ours)} solution cell(s) and yours {len(theirs)}: they cannot be "
                         f"paired, so nothing was replaced; copy your code over by hand from your notebook")
    for i, j in pairs.items():
        ours[i]["source"] = theirs[j]["source"]
    return new, len(pairs)


def replace(workspace: Path, name: str, *, keep_solutions: bool = True, only_if_newer: bool = False,
            root: Path | None = None) -> dict:
    """Replace a workspace file with the package's version, keeping the old one in ``.dpteach/backups/``
    and (for an exercise) the learner's solution cells. Returns what happened."""
    workspace = Path(workspace).expanduser().resolve()
    rel = resolve(workspace, name, root)
    source = materials.shipped_files(root, materials.WORKSPACE_FOLDERS)[rel]
    target, state = workspace / rel, _read_state(workspace)
    if only_if_newer and not _newer(source, state["files"].get(rel, {}).get("given")):
        return {"path": rel, "replaced": False, "why": "the package has no newer version", "backup": None}
    text = source.read_text(encoding="utf-8")
    carried = 0
    if keep_solutions and target.exists() and rel.endswith(".ipynb"):
        new, carried = carry_solutions(json.loads(target.read_text(encoding="utf-8")), json.loads(text))
        text = json.dumps(new, indent=1, ensure_ascii=False) + "\n"
    backup = None
    if target.exists() and target.read_text(encoding="utf-8") != text:
        backup = workspace / BACKUPS / time.strftime("%Y%m%d-%H%M%S") / rel
        backup.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(target, backup)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(target, text)
    state["files"][rel] = {"given": fingerprint(source)}
    _write_state(workspace, state)
    return {"path": rel, "replaced": True, "solutions_kept": carried,
            "backup": str(backup.relative_to(workspace)) if backup else None}
