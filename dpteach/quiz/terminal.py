"""The quiz in a plain terminal: numbered options, answers typed as ``2`` or ``1,3``.

For learners without JupyterLab, over SSH on a cluster login node, or for a quick self-check.
It reads and writes text streams (not ``input()``), so tests can drive it with a pipe.
"""
from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import TextIO

from .bank import Item
from .scoring import count_problem, is_correct, option_order

WIDTH = 88


def _wrap(text: str, indent: str, hanging: str | None = None) -> str:
    """``text`` wrapped to the terminal width; ``hanging`` indents the lines after the first."""
    return textwrap.fill(text, WIDTH, initial_indent=indent, subsequent_indent=hanging or indent)


def parse_answer(line: str, n_options: int) -> list[int]:
    """1-based option numbers typed as ``2``, ``1,3`` or ``1 3``; ValueError says what is allowed."""
    parts = line.replace(",", " ").split()
    if not parts:
        raise ValueError("type the number of an option")
    numbers = []
    for part in parts:
        if not part.isdigit() or not 1 <= int(part) <= n_options:
            raise ValueError(f"{part!r} is not an option number; use 1..{n_options}")
        if int(part) not in numbers:
            numbers.append(int(part))
    return numbers


def _ask(item: Item, number: int, total: int, shown: list[int], stdin: TextIO, stdout: TextIO) -> list[str] | None:
    """Show one question and read answers until one has the right count; None when input ends."""
    how_many = "pick one" if item.type == "single" else f"pick {item.select}"
    print(f"\nQuestion {number} of {total} - {item.topic_title} ({how_many})\n", file=stdout)
    if "\n" in item.stem:  # a stem with line breaks holds code: keep its lines as written
        print("\n".join(f"  {line}".rstrip() for line in item.stem.splitlines()), file=stdout)
    else:
        print(_wrap(item.stem, "  "), file=stdout)
    if item.figure:  # a terminal cannot show it: say where it is, and what it was drawn from
        print(_wrap(f"Figure: {item.figure['image']} (drawn from the trace {item.figure['trace']}, written by a "
                    f"real run of dpteach.experiments.{item.figure['run']['experiment']})", "  "), file=stdout)
    print(file=stdout)
    for position, index in enumerate(shown, 1):
        print(_wrap(f"{position}) {item.options[index].text}", "  ", "     "), file=stdout)
    example = "2" if item.type == "single" else ",".join(str(n) for n in range(1, item.select + 1))
    while True:
        print(f"\nYour answer (e.g. {example}; q to stop): ", end="", file=stdout, flush=True)
        line = stdin.readline()
        if line and not stdin.isatty():  # piped answers: echo them so the transcript reads naturally
            print(line.strip(), file=stdout)
        if not line or line.strip().lower() in {"q", "quit"}:
            return None
        try:
            numbers = parse_answer(line, len(shown))
        except ValueError as exc:
            print(f"  {exc}", file=stdout)
            continue
        chosen_indices = {shown[n - 1] for n in numbers}
        chosen = [option.text for i, option in enumerate(item.options) if i in chosen_indices]
        refusal = count_problem(item, chosen)
        if refusal:
            print(f"  {refusal}", file=stdout)
            continue
        return chosen


def _explain(item: Item, shown: list[int], chosen: list[str], stdout: TextIO) -> None:
    print("\n  Correct." if is_correct(item, chosen) else "\n  Not correct.", file=stdout)
    for position, index in enumerate(shown, 1):
        option = item.options[index]
        mark = "right" if option.correct else "wrong"
        picked = ", you chose it" if option.text in chosen else ""
        print(_wrap(f"[{mark}{picked}] {position}) {option.text}", "  ", "     "), file=stdout)
        print(_wrap(option.explanation, "      "), file=stdout)
    print(_wrap(f"Common trap: {item.trap}", "  "), file=stdout)
    print(_wrap(("See it live: " if item.demonstrated else "Read about it: ") + item.evidence, "  "), file=stdout)


def run_quiz(items: list[Item], seed: int, stdin: TextIO, stdout: TextIO,
             on_answer: Callable[[Item, bool, list[str]], None] | None = None) -> dict:
    """Ask every item in turn; returns ``{"score", "max_score", "answered", "items": [...]}``.

    ``on_answer(item, correct, chosen)`` is called after each accepted answer (to record progress).
    Input that ends early (EOF or ``q``) stops the quiz; the score covers what was answered.
    """
    rows = []
    for number, item in enumerate(items, 1):
        shown = option_order(item, seed)
        chosen = _ask(item, number, len(items), shown, stdin, stdout)
        if chosen is None:
            print("\n\nStopped.", file=stdout)
            break
        correct = is_correct(item, chosen)
        _explain(item, shown, chosen, stdout)
        if on_answer is not None:
            on_answer(item, correct, chosen)
        rows.append({"id": item.id, "correct": correct, "chosen": chosen, "expected": item.expected})
    score = sum(row["correct"] for row in rows)
    print(f"\nScore: {score} / {len(items)} ({len(rows)} of {len(items)} answered)", file=stdout)
    return {"score": score, "max_score": len(items), "answered": len(rows), "items": rows}
