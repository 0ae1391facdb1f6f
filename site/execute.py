"""The stored runs behind the site: execute notebooks under nbclient and keep them in ``site/outputs/``.

Used by ``python site/build.py --execute [NAMES...]`` (see build.py); each notebook runs in a process of
its own, ``python site/execute.py --one SOURCE DESTINATION``, so that a time-out can stop it with its kernel.

A stored copy's metadata ``dpteach_site`` records the fingerprint of the source notebook's cells (a hash of
their types and sources), the dpteach version and git commit it ran at, and the machine (CPUs, torch, GPU).
The run is the test suite's (tests/test_notebook_clients.py): kernel ``python3``, the notebook's own folder
as working directory, the suite's CPU-only environment from the root conftest.py, a throwaway progress file.
What a copy keeps of its widgets - what a reader of the site can see - is ``compaction.py``'s.
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

from compaction import META, compact_widget_state, prune_widget_state, shrink_quizzes  # site/ is on sys.path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OUTPUTS = HERE / "outputs"
FOLDERS = ("notebooks", "exercises")
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
    # nbclient draws no widgets, so a panel would also write its results into the cell (dpteach/front_end.py);
    # the site draws each panel from its stored widget state instead (compaction.py), so the runs keep widgets only
    env["DPTEACH_WIDGETS"] = "on"
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
