"""``dpteach quiz``: take a quiz in the terminal, check the bank, list it, or score an answers file.

    dpteach quiz --topic overlap            ask every overlap item
    dpteach quiz --exam 10 --seed 3         ten items across topics (default: --exam 10)
    dpteach quiz --validate                 check every quizzes/*.yaml (exit 1 on a problem)
    dpteach quiz --list --json              id, topic, type, mirrors of every item
    dpteach quiz --answers a.json --json    score {"<item id>": ["<option text or bank index>", ...]}

The bank is ``--bank DIR``, else ``$DPTEACH_QUIZZES``, else ``quizzes/`` at the repository root.
Interactive answers are recorded in the progress store (``dpteach progress``) unless ``--no-record``;
answers files are for scripts and are not recorded.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dpteach.progress import ProgressStore
from dpteach.quiz.bank import default_bank_dir, load_bank, validate_bank
from dpteach.quiz.catalog import topic_titles
from dpteach.quiz.scoring import pick_items, score_answers
from dpteach.quiz.terminal import run_quiz

DEFAULT_EXAM_SIZE = 10


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--topic", metavar="T", help=f"ask the items of one topic: {', '.join(topic_titles())}")
    parser.add_argument("--exam", type=int, metavar="N",
                        help=f"ask N items drawn across all topics (the default, with N={DEFAULT_EXAM_SIZE})")
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="fixes the exam draw and option order")
    parser.add_argument("--bank", metavar="DIR", help="quiz bank folder (default: $DPTEACH_QUIZZES or quizzes/)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--validate", action="store_true", help="check every bank file; exit 1 on a problem")
    mode.add_argument("--list", action="store_true", help="list the items instead of asking them")
    mode.add_argument("--answers", metavar="FILE", help="score a JSON file {item id: [choices]} instead of asking")
    parser.add_argument("--json", action="store_true", help="machine-readable output for --list and --answers")
    parser.add_argument("--no-record", action="store_true", help="do not record answers in the progress store")


def _check_arguments(args) -> Path:
    if args.bank is not None and not Path(args.bank).is_dir():
        raise ValueError(f"--bank {args.bank!r} is not a folder; give the folder that holds the <topic>.yaml files")
    bank_dir = Path(args.bank) if args.bank is not None else default_bank_dir()
    topics = topic_titles(bank_dir)
    if args.topic is not None and args.topic not in topics:
        raise ValueError(f"--topic {args.topic!r} is not a course topic; choose one of: {', '.join(topics)}")
    if args.exam is not None and args.exam < 1:
        raise ValueError(f"--exam {args.exam} must be at least 1 (the number of items to ask)")
    if args.topic is not None and args.exam is not None:
        raise ValueError(f"--topic {args.topic!r} and --exam {args.exam} both given; choose one")
    if args.json and not (args.list or args.answers):
        raise ValueError("--json applies only to --list and --answers")
    return bank_dir


def _validate(bank_dir: Path) -> int:
    problems = validate_bank(bank_dir)
    if problems:
        for problem in problems:
            print(problem, file=sys.stderr)
        print(f"{len(problems)} problem(s) in the quiz bank {bank_dir}", file=sys.stderr)
        return 1
    bank = load_bank(bank_dir)
    files = len({item.source for item in bank.items})
    print(f"quiz bank {bank_dir}: {len(bank.items)} items in {files} files, all valid")
    return 0


def _list(bank, args) -> int:
    items = bank.topic(args.topic) if args.topic else bank.items
    rows = [{"id": item.id, "topic": item.topic, "type": item.type, "mirrors": item.mirrors} for item in items]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for row in rows:
            print(f"{row['id']:<36} {row['topic']:<17} {row['type']:<9} {row['mirrors'] or ''}")
    return 0


def _score_file(bank, args) -> int:
    try:
        answers = json.loads(Path(args.answers).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"--answers {args.answers!r}: no such file") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"--answers {args.answers!r} is not valid JSON ({exc}); "
                         'expected {"<item id>": ["<option text or 0-based index>", ...]}') from None
    result = score_answers(bank, answers)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for row in result["items"]:
            print(f"{'right' if row['correct'] else 'wrong':<6} {row['id']}")
        print(f"Score: {result['score']} / {result['max_score']}")
    return 0


def run(args) -> int:
    bank_dir = _check_arguments(args)
    if args.validate:
        return _validate(bank_dir)
    bank = load_bank(bank_dir)
    if args.list:
        return _list(bank, args)
    if args.answers:
        return _score_file(bank, args)
    if args.exam is not None and args.exam > len(bank.items):
        raise ValueError(f"--exam {args.exam}: the bank holds {len(bank.items)} items; choose 1..{len(bank.items)}")
    if args.topic is not None:
        items = pick_items(bank, args.topic)
    else:
        items = pick_items(bank, exam=args.exam or min(DEFAULT_EXAM_SIZE, len(bank.items)), seed=args.seed)
    store = None if args.no_record else ProgressStore()

    def record(item, correct, chosen):
        if store is not None:
            store.record_quiz(item.id, item.topic, correct, chosen)

    run_quiz(items, args.seed, sys.stdin, sys.stdout, on_answer=record)
    return 0


def main(argv=None) -> int:
    """``python -m dpteach.commands.quiz``: the same command without the other subcommands."""
    parser = argparse.ArgumentParser(prog="dpteach quiz", description="quizzes on data-parallel training")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except ValueError as exc:
        print(f"dpteach quiz: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
