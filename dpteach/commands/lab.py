"""``dpteach lab``: open JupyterLab on the course's first notebook.

JupyterLab prints the address to open, with its token. On a remote GPU machine, start it with
``--no-browser`` and forward its port over SSH from your own computer (``ssh -N -L 8888:localhost:8888
you@gpu-machine``), then open the printed ``http://localhost:8888/lab?token=...`` address locally.
"""
from __future__ import annotations

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


def run(args) -> int:
    root = course_root()
    notebooks = root / "notebooks"
    if not notebooks.is_dir():
        raise ValueError(f"the course folder {str(notebooks)!r} does not exist: run dpteach lab from a "
                         f"clone of the course, or set DPTEACH_COURSE to its folder")
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
