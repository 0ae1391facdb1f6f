"""The course's website (site/build.py): stored runs kept up to date, and a whole build, offline.

* Fast: every notebook of ``notebooks/`` and ``exercises/`` has a stored run in ``site/outputs/`` whose
  fingerprint matches its cells, so a lesson changed without refreshing its outputs fails here with the
  command that refreshes them; and every stored run turns into a page with no widget left in it (the
  panels' Output widgets shown as outputs, quizzes as links), without Sphinx.
* Slow: the whole site built into a temporary folder with the network unusable - proxies pointed at a dead
  port, and an audit hook in every Python process of the build that records any attempt to resolve a
  host name or open a socket to another machine - with Sphinx's warnings as errors; then its pages are
  read: every lesson, exercise and quiz topic has one, lessons whose run drew figures show them inline,
  no page shows a widget's repr, every quiz item's answer is folded in a ``<details>``, the GPU page exists.
"""
from __future__ import annotations

import html
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SITE = REPO / "site"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


sys.path.insert(0, str(SITE))  # the site's modules import each other by name, as build.py arranges
store = _load("dpteach_site_execute", SITE / "execute.py")
compaction = sys.modules["compaction"]
SOURCES = store.sources()
IDS = [store.label(path) for path in SOURCES]


def test_the_site_covers_every_lesson_of_the_course_table_and_every_exercise():
    from dpteach import course
    assert {p.name for p in SOURCES if p.parent.name == "notebooks"} == {lesson.notebook for lesson in course.LESSONS}
    assert [p for p in SOURCES if p.parent.name == "exercises"] == sorted((REPO / "exercises").glob("[0-9]*.ipynb"))


@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_every_notebook_has_an_up_to_date_stored_run(source):
    reason = store.stale_reason(source)
    if reason:
        pytest.fail(f"{reason}. The site shows the outputs of a stored run: refresh it with "
                    f"`{store.refresh_command(source)}` (every notebook: `make site-outputs`) and commit "
                    f"{store.stored_path(source).relative_to(REPO)}.", pytrace=False)


@pytest.fixture(scope="module")
def build():
    return _load("dpteach_site_build", SITE / "build.py")


@pytest.fixture(scope="module")
def site_pages(build):
    """site/pages.py (loading build.py first put site/ on sys.path, where it finds its siblings)."""
    return _load("dpteach_site_pages", SITE / "pages.py")


@pytest.mark.slow  # 10 s in all: the whole build below checks the same pages again
@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_a_stored_run_becomes_a_page_with_no_widget_left(source, site_pages):
    if store.stale_reason(source):
        pytest.skip("no up-to-date stored run (the test above says how to make one)")
    stored = store.read_json(store.stored_path(source))
    record = stored["metadata"][store.META]
    assert {"fingerprint", "dpteach", "machine", "executed"} <= set(record)
    assert {"cpus", "torch", "gpu"} <= set(record["machine"]) and record["dpteach"]["commit"]
    if source.parent.name == "notebooks":
        assert record["cells_with_errors"] == [], f"{store.label(source)}'s stored run has errors"
    from dpteach.quiz import load_bank
    page, counts = site_pages.notebook_page(source, load_bank().topics, {p.resolve() for p in SOURCES})
    shown = json.dumps([cell.get("outputs", []) for cell in page["cells"]])
    assert compaction.WIDGET_VIEW not in shown and "widgets" not in page["metadata"]
    assert "VBox(children=" not in shown and "HBox(children=" not in shown
    assert "Run it" in page["cells"][0]["source"]
    source_text = source.read_text(encoding="utf-8")
    if "ExperimentPanel(" in source_text:
        assert counts["panels"] > 0 and "Interactive <b>" in shown
    if "quiz.show(" in source_text:
        assert counts["quizzes"] > 0 and "quizzes/" in shown
    for cell in stored["cells"]:  # each quiz kept its items' topics when its widgets were dropped
        for output in cell.get("outputs", []):
            quiz = output.get("metadata", {}).get(store.META, {}).get("quiz")
            if quiz is not None:
                assert quiz["items"] > 0 and quiz["topics"], (store.label(source), quiz)


def _has_images(stored: dict) -> bool:
    shown = json.dumps([cell.get("outputs", []) for cell in stored["cells"]])
    return "image/png" in shown or "image/png" in json.dumps(stored["metadata"].get("widgets", {}))


@pytest.mark.slow
def test_the_whole_site_builds_offline_and_shows_every_page(offline_site):
    """The build is the session's one (``offline_site``, tests/site_build.py): offline, strict, watched."""
    stale = [store.label(source) for source in SOURCES if store.stale_reason(source)]
    assert not stale, f"stored runs out of date: {stale}; refresh them with `make site-outputs`"
    assert offline_site.returncode == 0, (f"the build failed:\n{offline_site.stdout[-4000:]}\n"
                                          f"{offline_site.stderr[-8000:]}")
    assert not offline_site.reached, f"the build reached for the network:\n{offline_site.reached[:2000]}"
    assert any("sphinx" in line for line in offline_site.watched), f"Sphinx ran unwatched: {offline_site.watched}"
    print(f"site built in {offline_site.seconds:.0f} s")
    out = offline_site.html

    pages = {path.relative_to(out).as_posix(): path.read_text(encoding="utf-8") for path in out.rglob("*.html")}
    for source in SOURCES:
        name = f"{source.parent.name}/{source.stem}.html"
        assert name in pages, f"no page for {store.label(source)}"
        text = pages[name]
        words = re.sub(r"<[^>]+>", "", text)  # code is split into spans, one per word
        assert "Run it" in words and "dpteach lab" in words and "make lab" in words, f"{name} has no Run-it box"
        if source.parent.name == "notebooks" and _has_images(store.read_json(store.stored_path(source))):
            assert "<img" in text, f"{name}: its stored run drew figures, but the page shows none inline"
        if "quiz.show(" in source.read_text(encoding="utf-8"):
            assert re.search(r"href=['\"]\.\./quizzes/[a-z_]+\.html", text), f"{name}: its quiz links to no quiz page"
    for name, text in pages.items():
        for repr_ in ("VBox(children=", "HBox(children=", "Output(layout=", "Output(outputs="):
            assert repr_ not in text, f"{name} shows a widget's repr {repr_!r}"
        for tag in re.findall(r"<img\b[^>]*>", text):  # every image says what it shows (site/alt_text.py)
            alt = re.search(r'\salt="([^"]*)"', tag)
            said = html.unescape(alt.group(1)).strip() if alt else ""
            assert len(said) > 20 and not re.search(r"_images/|\.(png|jpe?g|svg)$", said), (name, tag[:300])

    from dpteach.quiz import load_bank
    bank = load_bank()
    for topic in bank.topics:
        name = f"quizzes/{topic}.html"
        assert name in pages, f"no page for quiz topic {topic}"
        answers = re.findall(r"<details class=['\"]dpteach-quiz-answer['\"]>(.*?)</details>", pages[name], re.S)
        items = bank.topic(topic)
        assert len(answers) == len(items), f"{name}: {len(answers)} folded answers for {len(items)} items"
        for item, answer in zip(items, answers):
            letters = [chr(ord("A") + i) for i, option in enumerate(item.options) if option.correct]
            assert f"Answer: {', '.join(letters)}" in answer, (name, item.id)
            for option in item.options:  # the bank's `code spans` shown as code, as the widget shows them
                shown = re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(option.explanation.splitlines()[0]))
                assert shown in answer, (name, item.id, option.text)
            assert not re.search(r"`[^`<]+`", answer), (name, item.id, "a code span shown with its backticks")
            if item.figure:
                assert Path(item.figure["image"]).name in pages[name], (name, item.id, "figure missing")
    assert "quizzes/index.html" in pages and "index.html" in pages and "results.html" in pages
    gpu = pages.get("gpu.html", "")
    assert "Measured on a GPU" in gpu
    if not list((REPO / "benchmarks" / "results").glob("gpu_check_*.md")):
        assert "No GPU report has been committed yet" in gpu
