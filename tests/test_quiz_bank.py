"""The quiz bank: it validates, covers every practice question and topic, copies no sentence, and a
broken file is reported with its file name, the item id and the reason."""
import copy
import json
import re
from pathlib import Path

import pytest
import yaml

from dpteach import course
from dpteach.quiz import EXPERIMENTS, NOTEBOOKS, BankError, load_bank, topic_titles, validate_bank
from dpteach.quiz.bank import default_bank_dir
from dpteach.quiz.bank_checks import course_schema
from dpteach.quiz.catalog import lesson_topics, topic_header

SEEDS = Path(__file__).parents[2] / "shared" / "seeds"
BANK = default_bank_dir()
TOPICS = topic_titles(BANK)

# The practice questions and, for each, the concept every correct option must name (each correct
# option's text must contain every keyword of one of the sets) and how many distractors it has.
MIRRORS = {
    "000_6b2ee23ac958626e.txt#1": ("overlap", [{"overlap", "backward", "bucket"}], 3),
    "002_70a337c93e4221d5.txt#1": ("sync_async", [{"data parallelism"}, {"input pipeline", "prefetch"},
                                                  {"synchronous"}], 2),
    "004_80bd7ec0000ca684.txt#1": ("data_parallelism", [{"whole model", "share of each batch"}], 3),
    "004_80bd7ec0000ca684.txt#2": ("collectives", [{"all-reduce", "average"}], 3),
    "004_80bd7ec0000ca684.txt#3": ("memory", [{"parameters", "optimizer state"}], 3),
    "004_80bd7ec0000ca684.txt#4": ("nccl_algorithms", [{"size of the message", "topology"}], 3),
    "004_80bd7ec0000ca684.txt#5": ("overlap", [{"all-reduce", "backward"}], 3),
    "004_80bd7ec0000ca684.txt#6": ("accumulation", [{"b × w"}], 3),
    "004_80bd7ec0000ca684.txt#7": ("scaling", [{"communication", "data loading", "synchronisation"}], 3),
    "004_80bd7ec0000ca684.txt#8": ("accumulation", [{"gradients of several micro-batches", "before one optimizer update"}], 3),
}


@pytest.fixture(scope="module")
def bank():
    return load_bank(BANK)


def test_shipped_bank_validates():
    assert validate_bank(BANK) == []


def test_one_file_per_topic_named_after_it_with_its_title_and_lesson():
    for path in BANK.glob("*.yaml"):
        header = topic_header(path)
        assert header["topic"] == path.stem and header["title"].strip(), path.name
        assert course.lesson(header["lesson"]).number == header["lesson"], path.name


def test_each_lesson_asks_the_topics_it_teaches():
    taught = lesson_topics(BANK)
    for lesson in course.LESSONS:
        text = (BANK.parent / "notebooks" / lesson.notebook).read_text()
        asked = set(re.findall(r'quiz\.show\(\\"(\w+)\\"\)', text))
        assert asked == set(taught.get(lesson.number, [])), lesson.notebook


def test_the_schema_lists_come_from_the_course_table():
    definitions = course_schema()["$defs"]
    assert definitions["lesson"]["enum"] == [lesson.number for lesson in course.LESSONS]
    assert definitions["notebook"]["enum"] == list(NOTEBOOKS) == [lesson.notebook for lesson in course.LESSONS]
    assert definitions["experiment"]["enum"] == list(EXPERIMENTS)
    item = definitions["item"]["properties"]
    assert item["demonstrated_by"]["properties"]["experiment"] == {"$ref": "#/$defs/experiment"}
    for key in ("demonstrated_by", "explained_in"):
        assert item[key]["properties"]["notebook"] == {"$ref": "#/$defs/notebook"}


def test_a_new_topic_is_one_new_file(tmp_path):
    import shutil
    import subprocess
    import sys
    bank_dir = tmp_path / "quizzes"
    shutil.copytree(BANK, bank_dir)
    item = yaml.safe_load((BANK / "overlap.yaml").read_text())["items"][0]
    item = {**item, "id": "hsdp-two-levels", "topic": "hsdp"}
    item.pop("mirrors", None)
    (bank_dir / "hsdp.yaml").write_text(yaml.safe_dump(
        {"topic": "hsdp", "title": "Hybrid sharding", "lesson": "11", "items": [item]}, sort_keys=False))
    bank = load_bank(bank_dir)
    assert bank.topics["hsdp"] == "Hybrid sharding"
    # in course order: after the topics of lessons up to 11, before lesson 12's
    order = list(bank.topics)
    assert order.index("ddp_options") < order.index("hsdp") < order.index("sharding") < order.index("mixed_precision")
    assert [i.id for i in bank.topic("hsdp")] == ["hsdp-two-levels"]
    assert lesson_topics(bank_dir)["11"] == ["hsdp", "sharding"]
    listed = subprocess.run([sys.executable, "-m", "dpteach", "quiz", "--bank", str(bank_dir), "--topic", "hsdp",
                             "--list"], capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0 and "hsdp-two-levels" in listed.stdout, listed.stderr


def test_every_item_is_complete(bank):
    for item in bank.items:
        correct = [option for option in item.options if option.correct]
        assert correct, item.id
        assert len(correct) == item.select, item.id
        assert item.type == "single" and item.select == 1 or item.type == "multiple" and item.select >= 2, item.id
        assert all(option.explanation.strip() for option in item.options), item.id
        assert item.trap.strip() and item.stem.strip(), item.id
        assert item.notebook in NOTEBOOKS, item.id
        assert item.experiment in EXPERIMENTS if item.demonstrated else item.section, item.id


def test_at_least_ten_items_per_topic(bank):
    for topic in TOPICS:
        items = bank.topic(topic)
        originals = [item for item in items if item.mirrors is None]
        assert len(items) >= 10 and len(originals) >= 8, f"{topic}: {len(items)} items, {len(originals)} original"


def _correct_is_longest(item) -> bool:
    lengths = [len(option.text) for option in item.options]
    right = next(i for i, option in enumerate(item.options) if option.correct)
    return all(lengths[right] > n for i, n in enumerate(lengths) if i != right)


def test_the_longest_option_does_not_give_the_answer_away(bank):
    """In at most 35% of single-answer items is the correct option strictly the longest."""
    single = [item for item in bank.items if item.type == "single"]
    longest = [item.id for item in single if _correct_is_longest(item)]
    assert len(longest) <= 0.35 * len(single), f"{len(longest)} of {len(single)}: {longest}"


def test_no_length_rank_of_the_correct_option_is_a_safe_bet(bank):
    """Always picking the option of one length rank (the longest, the second longest, ...) must not pay:
    for each number of options, no rank holds more than 35% of the single-answer items."""
    by_size: dict[int, list[int]] = {}
    for item in bank.items:
        if item.type == "single":
            lengths = [len(option.text) for option in item.options]
            right = next(i for i, option in enumerate(item.options) if option.correct)
            order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
            by_size.setdefault(len(lengths), []).append(order.index(right))
    for size, ranks in by_size.items():
        if len(ranks) >= 20:  # too few items of this size to speak of a pattern
            worst = max(ranks.count(k) for k in range(size))
            assert worst <= 0.35 * len(ranks), (size, [ranks.count(k) for k in range(size)])


def _notebook_text(name: str) -> tuple[set[str], str]:
    """(the headings of a notebook's markdown cells, the text of its code cells)."""
    cells = json.loads((BANK.parent / "notebooks" / name).read_text(encoding="utf-8"))["cells"]
    headings = {line.lstrip("#").strip() for cell in cells if cell["cell_type"] == "markdown"
                for line in "".join(cell["source"]).splitlines() if line.startswith("#")}
    code = "\n".join("".join(cell["source"]) for cell in cells if cell["cell_type"] == "code")
    return headings, code


RANKS_AS_P = re.compile(r"\(p\s*-\s*1\)|\bp\s*(?:ranks|GPUs|processes|workers|nodes)\b|\blog2?\s*p\b|\bp\s*=\s*\d")


def test_the_world_size_is_written_W_as_in_the_lessons(bank):
    """One notation with the notebooks: W ranks, (W-1)/W, log2 W - never p."""
    for item in bank.items:
        texts = [item.stem, item.trap] + [o.text for o in item.options] + [o.explanation for o in item.options]
        for text in texts:
            assert not RANKS_AS_P.search(text), (item.id, RANKS_AS_P.search(text).group(0), text)


def test_every_item_points_at_a_section_that_exists_or_an_experiment_its_notebook_runs(bank):
    for item in bank.items:
        headings, code = _notebook_text(item.notebook)
        if item.demonstrated:
            assert re.search(rf"\b{item.experiment}\b", code), \
                f"{item.id}: {item.notebook} never calls {item.experiment}"
        else:
            assert item.section in headings, f"{item.id}: no section {item.section!r} in {item.notebook}"


def test_every_practice_question_is_mirrored_with_its_answer_key(bank):
    mirrored = {item.mirrors: item for item in bank.items if item.mirrors}
    assert set(mirrored) == set(MIRRORS)
    for key, (topic, keyword_sets, n_distractors) in MIRRORS.items():
        item = mirrored[key]
        assert item.topic == topic, key
        correct_texts = [text.lower() for text in item.expected]
        assert len(correct_texts) == len(keyword_sets), key
        for keywords in keyword_sets:
            assert any(all(word in text for word in keywords) for text in correct_texts), (key, keywords)
        assert len(item.options) - len(correct_texts) == n_distractors, key


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


@pytest.mark.skipif(not SEEDS.is_dir(), reason=f"practice files not found at {SEEDS} (../shared/seeds)")
def test_no_run_of_eight_words_is_copied_from_the_practice_files():
    copied = set()
    for seed in SEEDS.glob("*.txt"):
        words = _words(seed.read_text(encoding="utf-8"))
        copied |= {" ".join(words[i:i + 8]) for i in range(len(words) - 7)}
    for bank_file in BANK.glob("*.yaml"):
        words = _words(bank_file.read_text(encoding="utf-8"))
        found = {" ".join(words[i:i + 8]) for i in range(len(words) - 7)} & copied
        assert not found, f"{bank_file.name} repeats practice-file wording: {sorted(found)}"


@pytest.mark.skipif(not SEEDS.is_dir(), reason=f"practice files not found at {SEEDS} (../shared/seeds)")
def test_mirrors_name_existing_practice_questions(bank):
    for item in bank.items:
        if item.mirrors:
            name, number = item.mirrors.split("#")
            text = (SEEDS / name).read_text(encoding="utf-8")
            questions = len(re.findall(r"^\d+\. ", text, flags=re.M)) or 1
            assert 1 <= int(number) <= questions, item.mirrors


# -- malformed files ---------------------------------------------------------------------------

GOOD_ITEM = {
    "id": "bucket-good", "topic": "bucketing", "type": "single",
    "stem": "Which is right?",
    "options": [{"text": "This one", "correct": True, "explanation": "Because."},
                {"text": "That one", "correct": False, "explanation": "Because not."}],
    "trap": "Picking that one.",
    "demonstrated_by": {"notebook": "03_bucketing.ipynb", "experiment": "bucket_size_sweep"},
}


def _write(folder: Path, topic: str, items: list, raw: str | None = None) -> Path:
    path = folder / f"{topic}.yaml"
    path.write_text(raw if raw is not None else yaml.safe_dump(
        {"topic": topic, "title": topic.title(), "lesson": "03", "items": items}, sort_keys=False))
    return path


def _broken(change):
    item = copy.deepcopy(GOOD_ITEM)
    item["id"] = "bucket-broken"
    change(item)
    return item


MALFORMED = {
    "missing explanation": (lambda i: i["options"][1].pop("explanation"), "'explanation' is a required property"),
    "misspelt key": (lambda i: i["options"][0].update(explaination="x"), "'explaination' was unexpected"),
    "two correct in single": (lambda i: i["options"][1].update(correct=True), "exactly 1 correct option, found 2"),
    "no correct option": (lambda i: i["options"][0].update(correct=False), "exactly 1 correct option, found 0"),
    "multiple without select": (lambda i: i.update(type="multiple"), "needs 'select'"),
    "select on single": (lambda i: i.update(select=2), "'select' only applies to type 'multiple'"),
    "select disagrees": (lambda i: i.update(type="multiple", select=2), "'select' is 2 but 1 options are marked correct"),
    "unknown notebook": (lambda i: i["demonstrated_by"].update(notebook="99_nope.ipynb"), "'99_nope.ipynb' is not one of"),
    "unknown experiment": (lambda i: i["demonstrated_by"].update(experiment="nope"), "'nope' is not one of"),
    "empty trap": (lambda i: i.update(trap="   "), "trap: '   ': must not be empty"),
    "bad mirrors": (lambda i: i.update(mirrors="quiz.txt"), "must be '<seed file name>#<question number>'"),
    "wrong topic": (lambda i: i.update(topic="overlap"), "sits in the file for topic 'bucketing'"),
    "same option twice": (lambda i: i["options"][1].update(text="this one"), "two options have the same text"),
    "correct not boolean": (lambda i: i["options"][0].update(correct="yes"), "'yes' is not of type 'boolean'"),
    "neither shown nor explained": (lambda i: i.pop("demonstrated_by"), "needs exactly one of 'demonstrated_by'"),
    "both shown and explained": (lambda i: i.update(explained_in={"notebook": "02_collectives.ipynb",
                                                                 "section": "Quiz"}), "found ['demonstrated_by', 'explained_in']"),
    "explained without section": (lambda i: (i.pop("demonstrated_by"),
                                             i.update(explained_in={"notebook": "02_collectives.ipynb"})),
                                  "'section' is a required property"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_item_is_reported_with_file_item_and_reason(tmp_path, case):
    change, reason = MALFORMED[case]
    path = _write(tmp_path, "bucketing", [GOOD_ITEM, _broken(change)])
    problems = [str(problem) for problem in validate_bank(tmp_path)]
    assert problems, case
    assert any(path.name in text and "'bucket-broken'" in text and reason in text for text in problems), problems
    with pytest.raises(BankError) as raised:
        load_bank(tmp_path)
    assert reason in str(raised.value)


def test_duplicate_id_across_files_names_both_files(tmp_path):
    _write(tmp_path, "bucketing", [GOOD_ITEM])
    twin = dict(copy.deepcopy(GOOD_ITEM), topic="overlap")
    _write(tmp_path, "overlap", [twin])
    [problem] = [str(p) for p in validate_bank(tmp_path)]
    assert "overlap.yaml: item 'bucket-good'" in problem and "already used" in problem and "bucketing.yaml" in problem


def test_item_without_id_is_named_by_position(tmp_path):
    nameless = copy.deepcopy(GOOD_ITEM)
    del nameless["id"]
    _write(tmp_path, "bucketing", [GOOD_ITEM, nameless])
    assert any("item '#2 (no usable id)'" in str(p) and "'id' is a required property" in str(p)
               for p in validate_bank(tmp_path))


@pytest.mark.parametrize("raw, reason", [
    ("topic: bucketing\nitems: [\n", "cannot be read as YAML"),
    ("topic: bucketing\ntopic: overlap\nitems: []\n", "appears twice"),
    ("", "None is not of type 'object'"),
])
def test_unreadable_file_is_reported_with_its_name(tmp_path, raw, reason):
    path = _write(tmp_path, "bucketing", [], raw=raw)
    problems = [str(p) for p in validate_bank(tmp_path)]
    assert any(text.startswith(str(path)) and reason in text for text in problems), problems


def test_file_not_named_after_its_topic(tmp_path):
    _write(tmp_path, "misc", [GOOD_ITEM], raw=yaml.safe_dump(
        {"topic": "bucketing", "title": "Buckets", "lesson": "03", "items": [GOOD_ITEM]}, sort_keys=False))
    problems = [str(p) for p in validate_bank(tmp_path)]
    assert any("misc.yaml" in text and "the file name says 'misc'" in text for text in problems), problems


@pytest.mark.parametrize("header, reason", [
    ({"topic": "misc"}, "'title' is a required property"),
    ({"topic": "misc", "title": "Misc", "lesson": "31"}, "'31' is not one of"),
])
def test_a_topic_file_says_its_title_and_a_lesson_of_the_course(tmp_path, header, reason):
    (tmp_path / "misc.yaml").write_text(yaml.safe_dump({**header, "items": [GOOD_ITEM]}, sort_keys=False))
    problems = [str(p) for p in validate_bank(tmp_path)]
    assert any("misc.yaml" in text and reason in text for text in problems), problems


def test_missing_or_empty_folder(tmp_path):
    assert "does not exist" in str(validate_bank(tmp_path / "nowhere")[0])
    assert "holds no <topic>.yaml" in str(validate_bank(tmp_path)[0])
