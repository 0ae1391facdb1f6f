"""``dpteach lab``: open JupyterLab on the course's first notebook.

JupyterLab prints the address to open, with its token. On a remote GPU machine, start it with
``--no-browser`` and forward its port over SSH from your own computer (``ssh -N -L 8888:localhost:8888
you@gpu-machine``), then open the printed ``http://localhost:8888/lab?token=...`` address locally.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

FIRST_NOTEBOOK = "00_start_here.ipynb"


def course_root() -> Path:
    """The folder holding ``notebooks/`` and ``exercises/`` (the repository the package came from)."""
    return Path(os.environ.get("DPTEACH_COURSE", Path(__file__).resolve().parents[2]))


def add_arguments(parser) -> None:
    parser.add_argument("--port", type=int, default=None, help="port for JupyterLab (default: its own choice)")
    parser.add_argument("--no-browser", action="store_true", help="do not open a browser window")
    parser.add_argument("extra", nargs="*", help="further arguments passed to jupyter lab")


def kernel_metadata() -> dict:
    """The notebook metadata the Python kernel of this interpreter reports when it starts (ipykernel's
    kernel spec and ``language_info``)."""
    from ipykernel.ipkernel import IPythonKernel
    from ipykernel.kernelspec import get_kernel_dict
    spec = get_kernel_dict()
    return {"kernelspec": {"display_name": spec["display_name"], "language": spec["language"], "name": "python3"},
            "language_info": dict(IPythonKernel.language_info)}


def align_kernel_metadata(paths) -> list[Path]:
    """Write into each notebook the kernel metadata JupyterLab would write when its kernel starts.

    JupyterLab copies the kernel's spec and ``language_info`` (the Python version among them) into the
    notebook as soon as the kernel is ready, and a notebook whose metadata changed is marked modified:
    every lesson would open with the unsaved-changes mark before the learner touched it. Aligned
    beforehand, the copy changes nothing. Only the metadata is written (atomically), and only where it
    differs; returns the notebooks written."""
    want, written = kernel_metadata(), []
    for path in map(Path, paths):
        notebook = json.loads(path.read_text())
        if all(notebook.get("metadata", {}).get(key) == value for key, value in want.items()):
            continue
        notebook.setdefault("metadata", {}).update(want)
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
        written.append(path)
    return written


def run(args) -> int:
    root = course_root()
    notebooks = root / "notebooks"
    if not notebooks.is_dir():
        raise ValueError(f"the course folder {str(notebooks)!r} does not exist: run dpteach lab from a "
                         f"clone of the course, or set DPTEACH_COURSE to its folder")
    align_kernel_metadata([*notebooks.glob("*.ipynb"), *(root / "exercises").glob("*.ipynb")])
    command = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={root}"]
    first = notebooks / FIRST_NOTEBOOK
    if first.exists():
        command.append(str(first.relative_to(root)))
    if args.port:
        command.append(f"--port={args.port}")
    if args.no_browser:
        command.append("--no-browser")
    if hasattr(os, "geteuid") and os.geteuid() == 0 and not any("allow_root" in a or "allow-root" in a for a in args.extra):
        # Containers and rented GPU machines often log you in as root, where JupyterLab refuses to start
        # unless told that this is intended ("Running as root is not recommended").
        command.append("--allow-root")
    command += args.extra
    return subprocess.call(command, cwd=root)
