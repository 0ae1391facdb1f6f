"""``dpteach workspace``: your copy of the course against the version in the installed package.

    dpteach workspace                      # each lesson and exercise: as shipped, edited, newer in the package
    dpteach workspace update 03            # take the package's newer version of lesson/exercise 03
    dpteach workspace update --all         # every file the package has a newer version of
    dpteach workspace restore exercises/04 # back to the package's version (your solution cells kept)

A replaced file is kept first under ``.dpteach/backups/`` in the workspace, and an exercise keeps the
code in its solution cells unless ``--blank``. The rules, and what counts as an edit: ``dpteach/workspace.py``.
"""
from __future__ import annotations

import argparse
from pathlib import Path

ACTIONS = ("status", "update", "restore")


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
                             f"a unique start of its name (exercises/03)")


def _parse_words(args) -> None:
    inner = argparse.ArgumentParser(prog="dpteach workspace")
    _options(inner)
    inner.add_argument("words", nargs="*")
    more = inner.parse_intermixed_args(args.words)
    args.all, args.blank = args.all or more.all, args.blank or more.blank
    args.workspace = more.workspace or args.workspace
    words = more.words
    args.action, args.names = (words[0], words[1:]) if words[:1] and words[0] in ACTIONS else ("status", words)


def run(args) -> int:
    from ..workspace import default_workspace, replace, status

    _parse_words(args)
    workspace = Path(args.workspace).expanduser() if args.workspace else default_workspace()
    if not workspace.is_dir():
        raise ValueError(f"--workspace {str(workspace)!r} does not exist: `dpteach lab` makes it the first time "
                         f"(or give --workspace the folder it made)")
    if args.action == "status":
        if args.names or args.all or args.blank:
            raise ValueError(f"status takes no NAME, --all or --blank (got {' '.join(args.words) or 'options'}): "
                             f"give an ACTION first, one of {', '.join(ACTIONS)}")
        rows = status(workspace)
        width = max(len(r["path"]) for r in rows)
        print(f"Workspace {workspace.resolve()}")
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
