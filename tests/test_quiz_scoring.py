"""Choosing items, shuffling options and judging answers: the same rules for panel, terminal and scripts."""
from pathlib import Path

import pytest

from dpteach.quiz import load_bank, pick_items, score_answers
from dpteach.quiz.scoring import count_problem, is_correct, option_order, resolve_choice, resolve_choices


@pytest.fixture(scope="module")
def bank():
    return load_bank()


@pytest.fixture(scope="module")
def multiple(bank):
    return next(item for item in bank.items if item.type == "multiple")


def test_option_order_is_a_seeded_permutation(bank):
    item = bank.items[0]
    assert sorted(option_order(item, 3)) == list(range(len(item.options)))
    assert option_order(item, 3) == option_order(item, 3)
    assert any(option_order(i, 0) != option_order(i, 1) for i in bank.items)


def test_pick_items_by_topic_ids_and_exam(bank):
    assert [i.topic for i in pick_items(bank, "memory")] == ["memory"] * len(bank.topic("memory"))
    assert [i.id for i in pick_items(bank, ["scaling-strong-vs-weak", "bucket-reverse-order"])] == \
        ["scaling-strong-vs-weak", "bucket-reverse-order"]
    assert [i.id for i in pick_items(bank, "scaling-strong-vs-weak")] == ["scaling-strong-vs-weak"]
    exam = pick_items(bank, exam=12, seed=4)
    assert len({i.id for i in exam}) == 12
    assert exam == pick_items(bank, exam=12, seed=4)
    topic_files = list((Path(__file__).resolve().parents[1] / "quizzes").glob("*.yaml"))
    assert len({i.topic for i in pick_items(bank, exam=len(bank.items))}) == len(bank.topics) == len(topic_files)


@pytest.mark.parametrize("what, exam, message", [
    ("nope", None, "no quiz item with id 'nope'"),
    (["scaling-strong-vs-weak", "nope"], None, "no quiz item with id 'nope'"),
    (None, 0, "exam size 0 is not possible"),
    (None, 10_000, "exam size 10000 is not possible"),
    ("memory", 3, "not both"),
    (None, None, "say what to ask"),
])
def test_pick_items_refuses_with_a_reason(bank, what, exam, message):
    with pytest.raises(ValueError, match=message):
        pick_items(bank, what, exam=exam)


def test_answers_by_text_or_bank_index(bank, multiple):
    first = multiple.options[0].text
    assert resolve_choice(multiple, 0) == first
    assert resolve_choice(multiple, "0") == first
    assert resolve_choice(multiple, f"  {first.upper()} ") == first
    assert resolve_choices(multiple, [2, 0, 0]) == [multiple.options[0].text, multiple.options[2].text]
    numeric = bank.get("accum-effective-batch-numbers")  # options are numbers: text wins over index
    assert resolve_choice(numeric, "16") == "16" and resolve_choice(numeric, 0) == numeric.options[0].text
    for bad in (99, "99", "no such option", True, 1.5):
        with pytest.raises(ValueError, match=multiple.id):
            resolve_choice(multiple, bad)


def test_count_rule(bank, multiple):
    single = bank.items[0]
    assert count_problem(single, []) == "Pick one option before submitting."
    assert count_problem(single, ["a", "b"]) == "Pick exactly one option."
    assert count_problem(single, ["a"]) is None
    assert count_problem(multiple, ["a"]) == f"Pick exactly {multiple.select} options (you picked 1)."


def test_correct_means_exactly_the_correct_set(multiple):
    assert is_correct(multiple, multiple.expected)
    assert not is_correct(multiple, multiple.expected[:-1])
    wrong = next(o.text for o in multiple.options if not o.correct)
    assert not is_correct(multiple, multiple.expected[:-1] + [wrong])


def test_score_answers(bank, multiple):
    single = bank.get("scaling-strong-vs-weak")
    right = next(i for i, o in enumerate(single.options) if o.correct)
    wrong = next(o.text for o in multiple.options if not o.correct)
    result = score_answers(bank, {single.id: [right], multiple.id: multiple.expected[:2] + [wrong],
                                  "bucket-reverse-order": bank.get("bucket-reverse-order").expected})
    assert (result["score"], result["max_score"]) == (2, 3)
    rows = {row["id"]: row for row in result["items"]}
    assert rows[single.id] == {"id": single.id, "correct": True, "chosen": single.expected, "expected": single.expected}
    assert rows[multiple.id]["correct"] is False and rows[multiple.id]["expected"] == multiple.expected
    with pytest.raises(ValueError, match="no quiz item with id 'nope'"):
        score_answers(bank, {"nope": [0]})
    with pytest.raises(ValueError, match="must be a list"):
        score_answers(bank, {single.id: {"a": 1}})
