"""The stored runs behind the site: execute notebooks under nbclient and keep them in ``site/outputs/``.

Used by ``python site/build.py --execute [NAMES...]`` (see build.py); each notebook runs in a process of
its own, ``python site/execute.py --one SOURCE DESTINATION``, so that a time-out can stop it with its kernel.

A stored copy's metadata ``dpteach_site`` records the fingerprint of the source notebook's cells (a hash of
their types and sources), the dpteach version and git commit it ran at, and the machine (CPUs, torch, GPU).
The run is the test suite's (tests/test_notebook_clients.py): kernel ``python3``, the notebook's own folder
as working directory, the suite's CPU-only environment from the root conftest.py, a throwaway progress file.
Widget models that no displayed view reaches are dropped, a quiz widget keeps only its heading (the site
links it to its topic's page, which shows every item), and layout and style models keep only the settings
that differ from their defaults: a copy keeps what a reader of the site can see.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OUTPUTS = HERE / "outputs"
FOLDERS = ("notebooks", "exercises")
META = "dpteach_site"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
CELL_TIMEOUT_S = 300  # as tests/test_notebook_clients.py
NOTEBOOK_TIMEOUT_S = 1200
REFRESH_ALL = "make site-outputs"


# -- which notebooks, and their stored runs ------------------------------------------------------

def sources() -> list[Path]:
    """Every lesson and exercise notebook, lessons first, each folder in file order."""
    return [path for folder in FOLDERS for path in sorted((REPO / folder).glob("[0-9][0-9]_*.ipynb"))]


def stored_path(source: Path) -> Path:
    """Where the executed copy of ``source`` is kept: ``site/outputs/<folder>/<name>.ipynb``."""
    return OUTPUTS / source.parent.name / source.name


def label(source: Path) -> str:
    """``notebooks/03_bucketing``: how messages and the command line name a notebook."""
    return f"{source.parent.name}/{source.stem}"


def fingerprint(notebook) -> str:
    """The notebook's cells, hashed as a learner's workspace tells edits apart (``dpteach.workspace``)."""
    from dpteach.workspace import notebook_fingerprint
    return notebook_fingerprint(notebook)


def read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def refresh_command(source: Path) -> str:
    return f"python site/build.py --execute {label(source)}"


def stale_reason(source: Path) -> str | None:
    """None when the stored run of ``source`` matches it; else a sentence saying what is wrong."""
    stored = stored_path(source)
    if not stored.is_file():
        return f"{label(source)} has no stored run ({stored.relative_to(REPO)} is missing)"
    recorded = read_json(stored).get("metadata", {}).get(META, {}).get("fingerprint")
    if recorded != fingerprint(read_json(source)):
        return (f"{label(source)} changed since its stored run ({stored.relative_to(REPO)} was executed from "
                f"other cells)")
    return None


def stale_message(problems: list[tuple[Path, str]]) -> str:
    lines = [f"{len(problems)} notebook(s) have no up-to-date stored run for the site:"]
    for source, reason in problems:
        lines.append(f"  * {reason}: refresh it with `{refresh_command(source)}`")
    lines.append(f"Refresh every notebook with `{REFRESH_ALL}` (python site/build.py --execute), or build with "
                 f"`python site/build.py --execute-stale` to run the stale ones first.")
    return "\n".join(lines)


def resolve(names: list[str]) -> list[Path]:
    """Notebooks named on the command line: a file's path, ``notebooks/03_bucketing``, a name
    (``09_scaling``), or the start of one (``09``, ``exercises/04``) when only one notebook starts so."""
    every = sources()
    if not names:
        return every
    chosen = []
    for name in names:
        path = Path(name)
        if path.is_file():
            hits = [p for p in every if p == path.resolve()]
        else:
            key = name.removesuffix(".ipynb").strip("/")
            field = label if "/" in key else (lambda p: p.stem)
            hits = [p for p in every if field(p) == key] or [p for p in every if field(p).startswith(key)]
        if not hits:
            raise SystemExit(f"no notebook called {name!r}: name one of {', '.join(label(p) for p in every)}")
        if len(hits) > 1:
            raise SystemExit(f"{name!r} names several notebooks ({', '.join(label(h) for h in hits)}): name one")
        chosen += [h for h in hits if h not in chosen]
    return chosen


# -- executing --------------------------------------------------------------------------------

def suite_environment(gpu: bool, progress: str) -> dict:
    """The environment the test suite gives the notebooks it runs (the root conftest.py): CPU-only unless
    ``gpu``, and a throwaway progress file (``progress``), so that a run records nothing into the learner's
    own and starts, as a new learner does, with nothing recorded."""
    env = dict(os.environ)
    if not gpu:
        try:
            sys.path.insert(0, str(REPO))
            from conftest import CPU_ONLY  # the suite's own setting, so the two cannot drift
        except ImportError:  # pytest absent: the same values, as conftest.py writes them
            CPU_ONLY = {"DPTEACH_GPUS": "0", "CUDA_VISIBLE_DEVICES": ""}
        finally:
            sys.path.remove(str(REPO))
        env.update(CPU_ONLY)
    env["DPTEACH_PROGRESS"] = progress
    env.pop("DPTEACH_RECORD_DIR", None)
    return env


def git_state() -> dict:
    def git(*args):
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else None
    changed = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": git("rev-parse", "HEAD"), "uncommitted_changes": bool(changed) if changed is not None else None}


def machine() -> dict:
    """The machine as the notebook's kernel saw it (run in the kernel's environment)."""
    import torch
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpus": os.cpu_count(), "torch": torch.__version__, "gpu": gpu, "python": platform.python_version(),
            "platform": platform.platform()}


def reachable_models(notebook) -> set[str]:
    """Ids of the widget models a reader can reach: those a cell's output displays, and every model they
    refer to (children, layouts, styles, widgets shown inside an Output), recursively."""
    state = notebook.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    seen: set[str] = set()
    todo = [ref for cell in notebook.cells for output in cell.get("outputs", []) for ref in _refs(output)]
    while todo:
        model = todo.pop()
        if model in seen or model not in state:
            continue
        seen.add(model)
        todo += _refs(state[model])
    return seen


def _refs(value) -> list[str]:
    """Model ids referred to anywhere in a JSON value: "IPY_MODEL_<id>" strings and widget views' model_id."""
    found = []
    if isinstance(value, str):
        if value.startswith("IPY_MODEL_"):
            found.append(value[len("IPY_MODEL_"):])
    elif isinstance(value, list):
        for entry in value:
            found += _refs(entry)
    elif isinstance(value, dict):
        if WIDGET_VIEW in value and isinstance(value[WIDGET_VIEW], dict):
            found.append(value[WIDGET_VIEW].get("model_id"))
        for entry in value.values():
            found += _refs(entry)
    return [ref for ref in found if ref]


def prune_widget_state(notebook) -> tuple[int, int]:
    """Drop the widget models no displayed view reaches (a panel rebuilt by a later cell, closed widgets'
    leftovers); return (models kept, models dropped)."""
    widgets = notebook.metadata.get("widgets", {}).get(WIDGET_STATE)
    if not widgets:
        return 0, 0
    keep = reachable_models(notebook)
    state = widgets.get("state", {})
    dropped = [model for model in state if model not in keep]
    for model in dropped:
        del state[model]
    return len(state), len(dropped)


QUIZ_CLASS = "dpteach-quiz"  # the VBox of dpteach.quiz.QuizPanel


def shrink_quizzes(notebook) -> int:
    """Keep of each quiz widget only its heading, and write into the output that shows it which topics its
    items come from (metadata ``dpteach_site.quiz``): the site links a lesson's quiz to that topic's page,
    where every item is written out with its answer, so the items' own widgets (most of a lesson's stored
    widget state) are shown nowhere. Returns the number of quizzes shrunk."""
    import html as html_module
    import re as re_module

    from dpteach.quiz import topic_titles
    state = notebook.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    by_title = {title: topic for topic, title in topic_titles().items()}
    shrunk = 0
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            view = output.get("data", {}).get(WIDGET_VIEW)
            model = state.get(view.get("model_id")) if isinstance(view, dict) else None
            if model is None or QUIZ_CLASS not in model["state"].get("_dom_classes", []):
                continue
            if "quiz" in output.get("metadata", {}).get(META, {}):
                continue  # shrunk already (--recompact of a stored run): its items are gone, its record stays
            children = [ref[len("IPY_MODEL_"):] for ref in model["state"].get("children", [])]
            texts = {child: state.get(child, {}).get("state", {}).get("value", "") for child in children}
            heading = [child for child in children if texts[child].startswith("<h3>")]
            items = [child for child in children if "dpteach-quiz-item" in state.get(child, {}).get("state", {}).get(
                "_dom_classes", [])]
            topics = []
            for item in items:  # each item's first child: "<b>Question N</b> &middot; topic title &middot; ..."
                first = state[item]["state"]["children"][0][len("IPY_MODEL_"):]
                parts = state.get(first, {}).get("state", {}).get("value", "").split(" &middot; ")
                topic = by_title.get(html_module.unescape(parts[1])) if len(parts) > 1 else None
                if topic and topic not in topics:
                    topics.append(topic)
            title = re_module.sub(r"<[^>]+>", "", texts[heading[0]]) if heading else "Quiz"
            if not topics and html_module.unescape(title).startswith("Quiz: "):  # one topic: named once, above
                named = by_title.get(html_module.unescape(title)[len("Quiz: "):])
                topics = [named] if named else []
            output.setdefault("metadata", {})[META] = {"quiz": {"title": html_module.unescape(title),
                                                                "items": len(items), "topics": topics}}
            model["state"]["children"] = [f"IPY_MODEL_{child}" for child in heading]
            shrunk += 1
    return shrunk


def compact_widget_state(notebook) -> None:
    """Leave out of the layout and style models the settings left at their default (None: every one of
    ipywidgets' layout and style traits defaults to None) and the model's name and module, which the entry
    already gives: most of a panel's stored state, changing nothing it shows (a widget manager that loads
    the state fills the defaults back in)."""
    state = notebook.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    for model in state.values():
        if model.get("model_name", "").endswith(("LayoutModel", "StyleModel")):
            model["state"] = {key: value for key, value in model["state"].items()
                              if value is not None and model.get(key.lstrip("_")) != value}  # _model_name: said above


def write_stored(notebook, destination: Path) -> None:
    """Write a stored run compactly (one line per cell's output lines, no indentation), atomically."""
    import nbformat
    destination.parent.mkdir(parents=True, exist_ok=True)
    temporary = destination.with_suffix(".ipynb.tmp")
    temporary.write_text(nbformat.writes(notebook, indent=None, separators=(",", ":")) + "\n", encoding="utf-8")
    temporary.replace(destination)


def recompact(paths: list[Path]) -> None:
    """Prune and compact stored runs in place (their fingerprints and records unchanged)."""
    import nbformat
    for path in paths:
        notebook = nbformat.read(path, as_version=4)
        shrink_quizzes(notebook)
        prune_widget_state(notebook)
        compact_widget_state(notebook)
        before = path.stat().st_size
        write_stored(notebook, path)
        print(f"{path.relative_to(REPO)}: {before / 1024:.0f} KiB -> {path.stat().st_size / 1024:.0f} KiB")


def execute_one(source: Path, destination: Path, cell_timeout: int) -> None:
    """Run ``source`` under nbclient (in this process, whose environment the caller set) and store it."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    notebook = nbformat.read(source, as_version=4)
    cells = fingerprint(notebook)  # of the cells that ran, even if the file changes meanwhile
    exercise = source.parent.name == "exercises"
    # The notebook's own folder as working directory; an exercise ships as a stub, so a cell may fail on it
    # (as it does for a learner who opens it) and the run goes on.
    client = NotebookClient(notebook, timeout=cell_timeout, kernel_name="python3", store_widget_state=True,
                            record_timing=False, allow_errors=exercise,
                            resources={"metadata": {"path": str(source.parent)}})
    started = time.monotonic()
    try:
        client.execute()
    except CellExecutionError as error:
        raise SystemExit(f"{label(source)} failed to execute; nothing stored:\n{error}")
    seconds = time.monotonic() - started
    shrink_quizzes(notebook)
    kept, dropped = prune_widget_state(notebook)
    compact_widget_state(notebook)
    errors = [index for index, cell in enumerate(notebook.cells)
              if any(o.get("output_type") == "error" for o in cell.get("outputs", []))]
    import dpteach
    notebook.metadata[META] = {
        "source": label(source) + ".ipynb",
        "fingerprint": cells,
        "executed": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(seconds, 1),
        "dpteach": {"version": dpteach.__version__, **git_state()},
        "machine": machine(),
        "environment": {name: os.environ[name] for name in ("DPTEACH_GPUS", "CUDA_VISIBLE_DEVICES")
                        if name in os.environ},
        "cells_with_errors": errors,
        "widget_models": {"kept": kept, "dropped": dropped},
    }
    write_stored(notebook, destination)
    print(f"{label(source)}: ran in {seconds:.0f} s, stored {destination.relative_to(REPO)} "
          f"({destination.stat().st_size / 1024:.0f} KiB; widget models kept {kept}, dropped {dropped}"
          + (f"; cells with errors: {errors}" if errors else "") + ")", flush=True)


def execute(chosen: list[Path], notebook_timeout: int, cell_timeout: int, gpu: bool) -> list[str]:
    """Run each notebook in a process of its own (so a time-out can stop it and its kernel), each with a
    progress file of its own (its outputs do not depend on which notebooks ran before it); the failures."""
    failures = []
    for source in chosen:
        print(f"running {label(source)} ...", flush=True)
        with tempfile.TemporaryDirectory(prefix="dpteach-site-progress-") as folder:
            failure = _execute_in_child(source, suite_environment(gpu, os.path.join(folder, "progress.json")),
                                        notebook_timeout, cell_timeout)
        if failure:
            failures.append(failure)
    return failures


def _execute_in_child(source: Path, env: dict, notebook_timeout: int, cell_timeout: int) -> str | None:
    command = [sys.executable, str(Path(__file__).resolve()), "--one", str(source), str(stored_path(source)),
               "--cell-timeout", str(cell_timeout)]
    child = subprocess.Popen(command, env=env, cwd=source.parent, start_new_session=True)
    try:
        code = child.wait(timeout=notebook_timeout)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)  # the process, its kernel and the kernel's ranks
        child.wait()
        return f"{label(source)}: still running after {notebook_timeout} s; stopped, nothing stored"
    except KeyboardInterrupt:
        os.killpg(child.pid, signal.SIGKILL)
        raise
    return f"{label(source)}: failed (exit {code}); nothing stored, see above" if code != 0 else None


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Run one notebook and store it (build.py --execute calls this).")
    parser.add_argument("--one", nargs=2, metavar=("SOURCE", "DESTINATION"))
    parser.add_argument("--cell-timeout", type=int, default=CELL_TIMEOUT_S)
    parser.add_argument("--recompact", action="store_true", help="prune and compact every stored run in place")
    arguments = parser.parse_args()
    if arguments.recompact:
        recompact(sorted(OUTPUTS.glob("*/*.ipynb")))
    elif arguments.one:
        execute_one(Path(arguments.one[0]).resolve(), Path(arguments.one[1]).resolve(), arguments.cell_timeout)
    else:
        parser.error("give --one SOURCE DESTINATION or --recompact")
