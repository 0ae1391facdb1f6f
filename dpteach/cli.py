"""The ``dpteach`` command: ``dpteach <subcommand> --help`` for each.

Each subcommand lives in its own module with ``add_arguments(parser)`` and ``run(args) -> int``;
this file only lists them, so adding a command is one line in ``COMMANDS``.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
COMMANDS = {
    "lab": ("dpteach.commands.lab", "open the course in JupyterLab (from pip: in your own workspace)"),
    "workspace": ("dpteach.commands.workspace", "your workspace against the installed course: what is newer, update, restore"),
    "bench": ("dpteach.commands.bench", "measure collectives on this machine (algbw, busbw)"),
    "doctor": ("dpteach.commands.doctor", "what this machine offers and which backend the course uses"),
    "compare": ("dpteach.commands.compare", "train with every gradient-sync strategy and compare them"),
    "train": ("dpteach.commands.train", "train one strategy with checkpoints; resume from the newest after a crash"),
    "quiz": ("dpteach.commands.quiz", "practice-exam quizzes in the terminal; check or list the quiz bank"),
    "progress": ("dpteach.commands.progress", "your course progress: quiz answers per topic, exercise grades"),
    "batch-size": ("dpteach.commands.batch_size", "how big a batch: the critical batch size and the learning-rate rules"),
    "profile": ("dpteach.commands.profile", "record a few steps of every rank of your own training command (torch.profiler)"),
    "diagnose": ("dpteach.commands.diagnose", "read a job's per-rank traces: what slows it, and the lesson that explains it"),
    "grade": ("dpteach.commands.grade", "grade an exercise notebook on real ranks (exit 0 only on full marks)"),
    "autograder": ("dpteach.commands.autograder", "write a Gradescope autograder (setup.sh, run_autograder, zip) for an exercise"),
}


def build_parser(selected: str | None = None) -> argparse.ArgumentParser:
    """The parser; only the ``selected`` subcommand's module is imported (the others may import
    torch and more, which costs a second or two that ``dpteach --help`` should not pay)."""
    parser = argparse.ArgumentParser(prog="dpteach", description="Data-parallel training, taught by running it.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module, help_text) in COMMANDS.items():
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        if selected in (None, name):
            mod = importlib.import_module(module)
            mod.add_arguments(cmd)
            cmd.set_defaults(_run=mod.run)
    return parser


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    selected = next((a for a in argv if not a.startswith("-")), "")
    args = build_parser(selected).parse_args(argv)
    from .ranks.torchrun import in_torchrun_world, leave_torchrun_world, mark_failed
    code = 1  # until the command returns: an exception anywhere below is a failure
    try:
        code = int(args._run(args) or 0)
        return code
    except ValueError as exc:  # bad input: one clear line, no traceback
        print(f"dpteach {args.command}: error: {exc}", file=sys.stderr)
        code = 2
        return code
    finally:
        # A no-op unless the command joined a torchrun world. There, after a failure, the rank exits
        # at once with status 1, so its traceback (still on its way up) is printed here first.
        if code != 0:
            mark_failed()
            if in_torchrun_world() and sys.exc_info()[0] is not None:
                import traceback
                traceback.print_exc()
        leave_torchrun_world()


if __name__ == "__main__":
    sys.exit(main())
