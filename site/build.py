"""Build the course's static website (Sphinx + MyST-NB + sphinx-book-theme), offline, from a real run.

    python site/build.py                        # pages -> site/_pages, HTML -> site/_build/html
    python site/build.py --execute [NAMES...]   # run notebooks (all by default), store them in site/outputs/
    python site/build.py --execute-stale        # build, first running any notebook whose stored run is stale

``make site`` and ``make site-outputs`` run the first two.

This file is the driver: it checks the stored runs, has ``pages.py`` write the page sources (a home page,
every lesson and exercise with the outputs of a real run, one page per quiz topic, the benchmark results and
what was measured on a GPU) and runs Sphinx. The widgets' stored state becomes static outputs in
``static_widgets.py``.

The outputs come from the executed copies in ``site/outputs/`` (``site/execute.py`` says how they are made
and what they record). The build runs no notebook: it uses a copy only while the fingerprint it recorded
matches the notebook's cells, and stops on a stale or missing one with the command that refreshes it,
unless ``--execute-stale`` is given.

Nothing is fetched: MyST-NB executes nothing (``nb_execution_mode = "off"``), there is no intersphinx, no
widget JavaScript is loaded from a CDN (the pages carry no widget state), and the theme's assets are local.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import execute as store  # noqa: E402  (site/execute.py: the stored runs)
import alt_text  # noqa: E402  (site/alt_text.py: the figures' descriptions as alt text)
import theme_fixes  # noqa: E402  (site/theme_fixes.py: names the theme leaves out)
from pages import (gpu_page, home_page, notebook_page, notebook_title, quiz_index,  # noqa: E402
                   quiz_page, results_page)  # site/pages.py: the page sources

PAGES = HERE / "_pages"
HTML_OUT = HERE / "_build" / "html"


def check_stored(execute_stale: bool, notebook_timeout: int, cell_timeout: int, partial: bool) -> list[Path]:
    """The notebooks the site shows: all, once every stored run is up to date (running the stale ones first
    with ``execute_stale``); with ``partial``, only those whose stored run is."""
    problems = [(source, reason) for source in store.sources() if (reason := store.stale_reason(source))]
    if not problems:
        return store.sources()
    if partial:
        print(f"--partial: leaving out {len(problems)} notebook(s) with no up-to-date stored run: "
              + ", ".join(store.label(source) for source, _ in problems), flush=True)
        return [source for source in store.sources() if source not in dict(problems)]
    if not execute_stale:
        raise SystemExit(store.stale_message(problems))
    print(f"--execute-stale: running {len(problems)} notebook(s) whose stored run is stale or missing", flush=True)
    failures = store.execute([source for source, _ in problems], notebook_timeout, cell_timeout, gpu=False)
    if failures:
        raise SystemExit("\n".join(["could not refresh every stored run:", *failures]))
    return store.sources()


def write_pages(pages: Path, every: list[Path]) -> dict:
    """Write every page's source into ``pages`` (emptied first); return counts for the summary."""
    from dpteach.quiz import load_bank
    if pages.exists():
        shutil.rmtree(pages)
    (pages / "quizzes").mkdir(parents=True)
    bank = load_bank()
    topics = bank.topics
    lessons = [p for p in every if p.parent.name == "notebooks"]
    exercises = [p for p in every if p.parent.name == "exercises"]
    titles = {path: notebook_title(path) for path in every}
    lesson_names = {p.stem: titles[p] for p in lessons}
    page_files = {p.resolve() for p in every}
    counts = {"panels": 0, "quizzes": 0}
    for source in every:
        page, found = notebook_page(source, topics, page_files)
        (pages / source.parent.name).mkdir(exist_ok=True)
        (pages / source.parent.name / source.name).write_text(json.dumps(page, ensure_ascii=False), encoding="utf-8")
        for key in counts:
            counts[key] += found[key]
    for topic, title in topics.items():
        (pages / "quizzes" / f"{topic}.md").write_text(
            quiz_page(topic, title, bank.topic(topic), pages / "quizzes" / "figures",
                      {f"{stem}.ipynb": name for stem, name in lesson_names.items()}), encoding="utf-8")
    (pages / "quizzes" / "index.md").write_text(quiz_index(topics, bank, lesson_names), encoding="utf-8")
    (pages / "results.md").write_text(results_page(), encoding="utf-8")
    (pages / "gpu.md").write_text(gpu_page(), encoding="utf-8")
    (pages / "index.md").write_text(home_page(lessons, exercises, topics, bank, titles), encoding="utf-8")
    return {"lessons": len(lessons), "exercises": len(exercises), "topics": len(topics), **counts}


def run_sphinx(pages: Path, out: Path, strict: bool, jobs: str) -> int:
    command = [sys.executable, "-m", "sphinx", "-b", "html", "-c", str(HERE), "-q", "-j", jobs,
               *(["-W", "--keep-going"] if strict else []), str(pages), str(out)]
    return subprocess.run(command).returncode


def finish_pages(out: Path, alts: dict) -> int:
    """What Sphinx's pages still need, in one pass over them: each figure's description as its alt text
    (``alt_text.py``) and names for the theme's unnamed toggles (``theme_fixes.py``). Returns the figures described."""
    described = 0
    for page in out.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        fixed, count = alt_text.describe_images(text, alts)
        fixed, _ = theme_fixes.name_toggles(fixed)
        described += count
        if fixed != text:
            page.write_text(fixed, encoding="utf-8")
    return described


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--execute", nargs="*", metavar="NAME",
                        help="run these notebooks (default: all) and store them in site/outputs/; build nothing")
    parser.add_argument("--execute-stale", action="store_true",
                        help="build, first running the notebooks whose stored run is stale or missing")
    parser.add_argument("--pages", type=Path, default=PAGES, help=f"where the page sources go (default {PAGES})")
    parser.add_argument("--out", type=Path, default=HTML_OUT, help=f"where the HTML goes (default {HTML_OUT})")
    parser.add_argument("--partial", action="store_true",
                        help="leave out the notebooks with no up-to-date stored run (for work on the site itself)")
    parser.add_argument("--strict", action="store_true", help="turn Sphinx warnings into errors (-W)")
    parser.add_argument("-j", "--jobs", default="auto", help="Sphinx's parallel jobs (default auto)")
    parser.add_argument("--notebook-timeout", type=int, default=store.NOTEBOOK_TIMEOUT_S,
                        help="seconds one notebook may run under --execute (default %(default)s)")
    parser.add_argument("--cell-timeout", type=int, default=store.CELL_TIMEOUT_S,
                        help="seconds one cell may run under --execute (default %(default)s)")
    parser.add_argument("--gpu", action="store_true",
                        help="--execute with the machine's GPUs visible (default: CPU-only, as the test suite)")
    args = parser.parse_args(argv)
    if args.execute is not None:
        failures = store.execute(store.resolve(args.execute), args.notebook_timeout, args.cell_timeout, args.gpu)
        for line in failures:
            print(f"FAILED {line}", file=sys.stderr)
        return 1 if failures else 0
    started = time.monotonic()
    shown = check_stored(args.execute_stale, args.notebook_timeout, args.cell_timeout, args.partial)
    counts = write_pages(args.pages.resolve(), shown)
    code = run_sphinx(args.pages.resolve(), args.out.resolve(), args.strict, args.jobs)
    if code == 0:
        counts["described"] = finish_pages(args.out.resolve(), alt_text.alts_of(args.pages.resolve()))
        print(f"site built in {time.monotonic() - started:.0f} s: {counts['lessons']} lessons, {counts['exercises']} "
              f"exercises, {counts['topics']} quiz topics ({counts['panels']} panels and {counts['quizzes']} quizzes "
              f"made static, {counts['described']} figures given their descriptions) -> "
              f"{args.out.resolve() / 'index.html'}")
    return code


if __name__ == "__main__":
    sys.exit(main())
