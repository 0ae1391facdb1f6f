"""Quiz-bank statistics an author checks before committing: items per topic, how often the correct
option of a single-answer item is strictly the longest, and any run of 8 words shared with the
practice files.

    python scripts/quiz_stats.py [--seeds DIR] [TOPIC ...]

The same bars are asserted by tests/test_quiz_bank.py on the whole bank.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

from dpteach.quiz.bank import check_bank, default_bank_dir  # noqa: E402


def correct_is_longest(item) -> bool:
    """True when the single correct option is strictly longer than every distractor."""
    lengths = [len(option.text) for option in item.options]
    right = next(i for i, option in enumerate(item.options) if option.correct)
    return all(lengths[right] > n for i, n in enumerate(lengths) if i != right)


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def eight_word_runs(text: str) -> set[str]:
    w = words(text)
    return {" ".join(w[i:i + 8]) for i in range(len(w) - 7)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default=str(HERE.parent / "shared" / "seeds"))
    parser.add_argument("topics", nargs="*")
    args = parser.parse_args()
    items, problems = check_bank(default_bank_dir())
    for problem in problems:
        print("PROBLEM", problem)
    seeds = Path(args.seeds)
    copied = set()
    if seeds.is_dir():
        for seed in seeds.glob("*.txt"):
            copied |= eight_word_runs(seed.read_text(encoding="utf-8"))
    topics = args.topics or sorted({item.topic for item in items})
    total_single = total_longest = 0
    for topic in topics:
        mine = [item for item in items if item.topic == topic]
        single = [item for item in mine if item.type == "single"]
        longest = [item.id for item in single if correct_is_longest(item)]
        shown = sum(item.demonstrated for item in mine)
        total_single += len(single)
        total_longest += len(longest)
        print(f"{topic:18s} items {len(mine):3d}  demonstrated {shown:3d}  explained {len(mine) - shown:3d}  "
              f"single {len(single):3d}  correct-longest {len(longest):3d}"
              + (f" ({len(longest) / len(single):.0%})" if single else ""))
        if longest:
            print("    correct option is the longest in:", ", ".join(longest))
        bank_file = default_bank_dir() / f"{topic}.yaml"
        if copied and bank_file.exists():
            found = eight_word_runs(bank_file.read_text(encoding="utf-8")) & copied
            if found:
                print("    COPIED from practice files:", sorted(found))
    if total_single:
        print(f"all listed topics: correct option strictly longest in {total_longest} of {total_single} "
              f"single-answer items ({total_longest / total_single:.0%}); the bar is at most 35%")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
