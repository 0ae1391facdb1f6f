"""Which items a quiz session asks, in which option order, and whether an answer is right.

The notebook panel, the terminal quiz and the answers-file mode all go through these functions,
so an answer is judged the same way wherever it was given: an item is correct when the set of
chosen options equals the set of correct options - no partial credit, as in certification exams.
"""
from __future__ import annotations

import random
from collections.abc import Iterable, Sequence

from .bank import Bank, Item


def pick_items(bank: Bank, what: str | Sequence[str] | None = None, exam: int | None = None,
               seed: int = 0) -> list[Item]:
    """The items for one session.

    ``what`` is a topic id, one item id, or a list of item ids; ``exam=N`` instead draws N items
    across all topics (seeded). Giving both is ambiguous and refused.
    """
    if exam is not None:
        if what is not None:
            raise ValueError(f"give either a topic/item ids or exam={exam}, not both (got {what!r})")
        return bank.exam(int(exam), seed)
    if what is None:
        raise ValueError(f"say what to ask: a topic ({', '.join(bank.topics)}), item ids, or exam=N")
    if isinstance(what, str):
        return bank.topic(what) if what in bank.topics else [bank.get(what)]
    return [bank.get(item_id) for item_id in what]


def option_order(item: Item, seed: int = 0) -> list[int]:
    """Bank indices of ``item``'s options in the order shown; fixed for a given seed.

    Shuffling keeps learners from memorising positions; seeding on the item id as well means the
    order of one item does not change when other items are added to the session.
    """
    order = list(range(len(item.options)))
    random.Random(f"{seed}:{item.id}").shuffle(order)
    return order


def resolve_choice(item: Item, answer) -> str:
    """The option text meant by ``answer``: an option's text, or its 0-based index in bank order.

    A string is matched against the texts first (some options are numbers, like "512"); only a
    string of digits that is no option's text is read as an index.
    """
    if isinstance(answer, str):
        for option in item.options:
            if option.text.strip().lower() == answer.strip().lower():
                return option.text
        if answer.strip().isdigit():
            answer = int(answer)
    if isinstance(answer, int) and not isinstance(answer, bool):  # True is an int, but no option number
        if not 0 <= answer < len(item.options):
            raise ValueError(f"item {item.id!r}: option index {answer} is out of range; "
                             f"use 0..{len(item.options) - 1} (bank order) or the option's text")
        return item.options[answer].text
    raise ValueError(f"item {item.id!r}: {answer!r} matches no option; use 0..{len(item.options) - 1} "
                     f"(bank order) or one of the texts: {[option.text for option in item.options]}")


def resolve_choices(item: Item, answers: Iterable) -> list[str]:
    """Chosen option texts, de-duplicated, in bank order (so results compare and print stably)."""
    chosen = {resolve_choice(item, answer) for answer in answers}
    return [option.text for option in item.options if option.text in chosen]


def count_problem(item: Item, chosen: Sequence[str]) -> str | None:
    """Why a submission with this many choices is refused, or None when the count is right."""
    if len(chosen) == item.select:
        return None
    if item.type == "single":
        return "Pick one option before submitting." if not chosen else "Pick exactly one option."
    return f"Pick exactly {item.select} options (you picked {len(chosen)})."


def is_correct(item: Item, chosen: Iterable[str]) -> bool:
    return set(chosen) == set(item.expected)


def score_answers(bank: Bank, answers: dict) -> dict:
    """Score an answers mapping ``{item id: [option text or bank index, ...]}``.

    Every item named in ``answers`` counts once; the result is plain data for ``--json``.
    """
    if not isinstance(answers, dict):
        raise ValueError("answers must be a JSON object mapping item ids to lists of choices")
    rows = []
    for item_id, raw in answers.items():
        item = bank.get(item_id)
        if isinstance(raw, (str, int)):
            raw = [raw]
        if not isinstance(raw, list):
            raise ValueError(f"item {item_id!r}: answer must be a list of option texts or indices, got {raw!r}")
        chosen = resolve_choices(item, raw)
        rows.append({"id": item.id, "correct": is_correct(item, chosen), "chosen": chosen,
                     "expected": item.expected})
    return {"score": sum(row["correct"] for row in rows), "max_score": len(rows), "items": rows}
