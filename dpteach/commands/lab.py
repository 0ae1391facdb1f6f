"""``dpteach lab``: open JupyterLab on the course's first notebook.

From a clone, the lab opens the clone itself (``make lab``). From an installed package (``pip install
dpteach``), it opens the learner's workspace - ``~/dpteach-course``, or ``--workspace DIR`` - and copies the
lessons and exercises into it the first time; a file already there is never overwritten
(``dpteach/workspace.py``; ``dpteach workspace`` shows what is newer in the package and updates on request).

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


def add_arguments(parser) -> None:
    parser.add_argument("--port", type=int, default=None, help="port for JupyterLab (default: its own choice)")
    parser.add_argument("--workspace", metavar="DIR", default=None,
                        help="your own copy of the course to open (default from an installed package: "
                             "$DPTEACH_WORKSPACE or ~/dpteach-course; from a clone: the clone itself)")
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


def open_folder(workspace: str | None) -> Path:
    """The folder the lab serves: the clone itself, or the learner's workspace, made ready first."""
    from .. import materials
    from ..workspace import choose, default_workspace

    if workspace is None and not materials.installed():
        return materials.course_root()
    ready = choose(Path(workspace) if workspace else default_workspace())  # later commands then mean this one
    root = Path(ready["workspace"])
    if ready["copied"]:
        print(f"dpteach: copied {len(ready['copied'])} course files into your workspace {root}")
    else:
        print(f"dpteach: your workspace {root} (your files are kept as they are)")
    if ready["newer"]:
        print(f"dpteach: {len(ready['newer'])} have a newer version in the package - see `dpteach workspace "
              f"--workspace {root}`: {', '.join(ready['newer'])}")
    return root


def run(args) -> int:
    root = open_folder(args.workspace)
    notebooks = root / "notebooks"
    align_kernel_metadata([*notebooks.glob("*.ipynb"), *(root / "exercises").glob("*.ipynb")])
    command = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={root}"]
    first = notebooks / FIRST_NOTEBOOK
    if first.exists():
        # The lab's own address becomes lesson 00's: the URL JupyterLab prints (with --no-browser too, where no
        # browser is opened for the learner) and the one a browser is sent to both open the course, not the Launcher.
        command.append(f"--LabApp.default_url=/lab/tree/{first.relative_to(root).as_posix()}")
    if args.port:
        command.append(f"--port={args.port}")
    if args.no_browser:
        command.append("--no-browser")
    if hasattr(os, "geteuid") and os.geteuid() == 0 and not any("allow_root" in a or "allow-root" in a for a in args.extra):
        # Containers and rented GPU machines often log you in as root, where JupyterLab refuses to start
        # unless told that this is intended ("Running as root is not recommended").
        command.append("--allow-root")
    command += args.extra
    if os.name == "posix":
        # Become the server rather than wait on it as a child: a SIGTERM from a process manager, or the hang-up
        # of a closed session, then reaches JupyterLab itself, which shuts its kernels down and exits. A parent
        # that waited would die of the signal and leave the server running, orphaned.
        os.chdir(root)
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, command)
    return subprocess.call(command, cwd=root)
