"""``dpteach workspace``: your copy of the course against the version in the installed package.

    dpteach workspace init [DIR]           # copy the course into DIR, start no server (JupyterHub, a running lab)
    dpteach workspace                      # each lesson and exercise: as shipped, edited, newer in the package
    dpteach workspace update 03            # take the package's newer version of lesson/exercise 03
    dpteach workspace update --all         # every file the package has a newer version of
    dpteach workspace restore exercises/04 # back to the package's version (your solution cells kept)

``init`` copies exactly what the first ``dpteach lab`` copies (``workspace.choose``), and later ones
only what is missing: a file that is there is never overwritten. A replaced file is kept first under
``.dpteach/backups/`` in the workspace, and an exercise keeps the code in its solution cells unless
``--blank``. The rules, and what counts as an edit: ``dpteach/workspace.py``.
"""
from __future__ import annotations

import argparse
from pathlib import Path

ACTIONS = ("status", "init", "update", "restore")


def _options(parser) -> None:
    parser.add_argument("--all", action="store_true", help="update: every file with a newer version in the package")
    parser.add_argument("--blank", action="store_true", help="restore: take the stub too, dropping your solution code")
    parser.add_argument("--workspace", metavar="DIR", default=None,
                        help="the workspace (default: $DPTEACH_WORKSPACE or ~/dpteach-course)")


def add_arguments(parser) -> None:
    _options(parser)
    # [ACTION] NAME... with options anywhere among them: argparse cannot mix an optional positional, options
    # and more positionals, so the words are kept whole here and parsed intermixed in run()
    parser.add_argument("words", nargs=argparse.REMAINDER, metavar="[ACTION] NAME ...",
                        help=f"ACTION: {', '.join(ACTIONS)} (default: status); NAME: a course file, as a path or "
                             f"a unique start of its name (exercises/03); init takes DIR instead")


def _parse_words(args) -> None:
    inner = argparse.ArgumentParser(prog="dpteach workspace")
    _options(inner)
    inner.add_argument("words", nargs="*")
    more = inner.parse_intermixed_args(args.words)
    args.all, args.blank = args.all or more.all, args.blank or more.blank
    args.workspace = more.workspace or args.workspace
    words = more.words
    args.action, args.names = (words[0], words[1:]) if words[:1] and words[0] in ACTIONS else ("status", words)


def _init_folder(args) -> Path:
    """The folder ``init`` copies into: DIR, else --workspace, else the default workspace."""
    from ..workspace import workspace_and_why

    if args.all or args.blank:
        raise ValueError("init takes no --all or --blank: give it a DIR (or --workspace DIR), or nothing")
    if len(args.names) > 1:
        raise ValueError(f"init takes one DIR, got {len(args.names)}: {' '.join(args.names)}")
    if args.names and args.workspace and Path(args.names[0]).expanduser() != Path(args.workspace).expanduser():
        raise ValueError(f"DIR {args.names[0]!r} and --workspace {args.workspace!r} differ: give one of them")
    if args.names:
        given, argument = args.names[0], "DIR"
    elif args.workspace:
        given, argument = args.workspace, "--workspace"
    else:
        folder, why = workspace_and_why()
        given, argument = str(folder), f"the default workspace ({why})"
    folder = Path(given).expanduser()
    blocked = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
    if blocked is not None:
        what = "is a file" if blocked == folder else f"is inside {str(blocked)!r}, a file"
        raise ValueError(f"{argument} {given!r} {what}, not a folder: give a new folder (init makes it) or a "
                         f"workspace that `dpteach workspace init` or `dpteach lab` made")
    return folder


def _count(paths: list[str]) -> str:
    """``17 lessons, 11 exercises and exercises/README.md``: the course files among ``paths``, in words."""
    lessons = sum(p.startswith("notebooks/") and p.endswith(".ipynb") for p in paths)
    exercises = sum(p.startswith("exercises/") and p.endswith(".ipynb") for p in paths)
    others = [p for p in paths if not p.endswith(".ipynb")]
    more = (f" and {', '.join(others)}" if len(others) <= 2 else f" and {len(others)} other files") if others else ""
    return f"{lessons} lessons, {exercises} exercises{more}"


def init(args) -> int:
    """Copy the course in as the first ``dpteach lab`` does (the same ``workspace.choose``), and start no server."""
    from ..workspace import choose
    from .lab import FIRST_NOTEBOOK

    folder = _init_folder(args)
    new = not folder.exists()
    ready = choose(folder)  # later commands without --workspace mean this one
    root, copied, kept = Path(ready["workspace"]), ready["copied"], ready["kept"]
    print(f"Workspace {root}{' (a new folder)' if new else ''}")
    if copied:
        print(f"  copied {_count(copied)}; {len(kept)} already there, left untouched")
    else:
        print(f"  nothing copied: all {len(kept)} course files are already there ({_count(kept)}), left untouched")
    if ready["newer"]:
        print(f"  {len(ready['newer'])} have a newer version in the package: `dpteach workspace --workspace "
              f"{root}` lists them, `dpteach workspace update NAME` takes one")
    first = root / "notebooks" / FIRST_NOTEBOOK
    if first.exists():
        home = Path.home().resolve()
        where = f" ({first.relative_to(home).as_posix()} from your home folder)" if first.is_relative_to(home) else ""
        print(f"Next: open {first.relative_to(root).as_posix()} in that folder - in a running Jupyter server "
              f"(JupyterLab, JupyterHub), from its file browser{where}.")
        print(f"Or start JupyterLab on the folder: dpteach lab --workspace {root}")
    return 0


def run(args) -> int:
    from ..workspace import replace, status, workspace_and_why

    _parse_words(args)
    if args.action == "init":
        return init(args)
    workspace, why = (Path(args.workspace).expanduser(), "--workspace") if args.workspace else workspace_and_why()
    if not workspace.is_dir():
        raise ValueError(f"--workspace {str(workspace)!r} does not exist: `dpteach workspace init DIR` makes it "
                         f"(without starting a server), `dpteach lab` makes it the first time it opens (or give "
                         f"--workspace the folder one of them made)")
    if args.action == "status":
        if args.names or args.all or args.blank:
            raise ValueError(f"status takes no NAME, --all or --blank (got {' '.join(args.words) or 'options'}): "
                             f"give an ACTION first, one of {', '.join(ACTIONS)}")
        rows = status(workspace)
        width = max(len(r["path"]) for r in rows)
        print(f"Workspace {workspace.resolve()} ({why})")
        for row in rows:
            print(f"  {row['path']:<{width}}  {row['state']}")
        newer = [r["path"] for r in rows if r["newer"]]
        if newer:
            print(f"\n{len(newer)} newer in the package: `dpteach workspace update NAME` takes one (your solution "
                  f"cells kept, the old file backed up), `--all` takes them all")
        return 0
    if args.blank and args.action != "restore":
        raise ValueError("--blank belongs to restore")
    if args.all and (args.action != "update" or args.names):
        raise ValueError("--all belongs to update, without NAMEs")
    names = [r["path"] for r in status(workspace) if r["newer"]] if args.all else args.names
    if not names and not args.all:
        raise ValueError(f"{args.action} needs a NAME (a course file, e.g. 03 or exercises/04_overlap_hook.ipynb)")
    for name in names:
        done = replace(workspace, name, keep_solutions=not args.blank, only_if_newer=args.action == "update")
        if not done["replaced"]:
            print(f"{done['path']}: left as it is - {done['why']} (`restore` takes the package's version anyway)")
            continue
        kept = f", your {done['solutions_kept']} solution cell(s) kept" if done.get("solutions_kept") else ""
        backup = f"; the old file is in {done['backup']}" if done["backup"] else ""
        print(f"{done['path']}: now the package's version{kept}{backup}")
    if args.all and not names:
        print("Nothing to update: no file has a newer version in the package.")
    return 0
