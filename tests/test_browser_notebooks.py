"""Every lesson as a learner meets it in JupyterLab: Run All, then the Run button of its slowest panel (and of
every panel that asks for a prediction) after changing one of its controls, in headless Chromium.

Why not every panel's button: every panel is one class (``widgets/panel.py``), and its button path is the same
for all of them; the choices each panel offers all run under nbclient (``test_notebook_clients.py``). The
slowest panel is the one where a learner waits, so that is where what the learner sees while waiting is held
to its promise; a prediction panel adds the refusal of a non-number and the score.

For each notebook the test checks what a learner would see:

* no error output and no "Error displaying widget" placeholder anywhere in the notebook;
* every figure, after Run All and after every button run, is a complete PNG: it decodes to the end,
  has the size the page shows, and is drawn in both halves (the panels of an earlier version sent
  figures from the button path that held a title and nothing else; ``widgets/capture.py``);
* every panel's Run button runs again with the changed control and ends "done", and the panel then
  says that the cells below describe the earlier run (``.dpteach-stale``);
* while it runs, the learner sees it run: the status says "running" within 1 s of the click, the output
  shows the last result (greyed) until the new result replaces it in one change - never an emptied or
  half-drawn area - and a run that takes longer than 10 s shows a progress bar under the button (what
  ``ExperimentPanel.run`` promises);
* in every panel that asks for a prediction, text that is not a number is refused with a message and runs
  nothing, and a number typed into the box is scored under the run;
* the notebook opens unmodified (no dirty mark: ``dpteach lab`` writes the kernel metadata JupyterLab would);
* the first question of the lesson's quiz takes an answer and shows every option marked right or wrong;
* in lesson 00, the re-run flow a learner meets first: after its panel ran again with 3 ranks, its stale note is
  followed (the next cell selected, Run Selected Cell and All Below), and the sentence below then speaks of 3 ranks;
* the page handled every message the kernel sent: none is held behind a message whose handling never ended (a
  Run All that never ends is reported with the page's message log, the kernel's stacks and the lab's log);

and keeps a screenshot per notebook (``test-output/browser/``, or ``$DPTEACH_TEST_OUTPUT/browser``). Lesson 00's
own browser tests (a slider, a quiz answer; the stale note followed) ran it in a lab of their own, twice more: they
are these steps now, in its one run here.
"""
from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
import time
import urllib.request
from pathlib import Path

import pytest

from dpteach.commands.lab import align_kernel_metadata
from labsession import (ALL_HANDLED, CHROMIUM_FLAGS, KERNEL_IDLE, RECORD_MESSAGES, browser_marks, chromium_path,
                        jupyterlab, kernel_stacks, message_report)

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p.name for p in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
OUTPUT = Path(os.environ.get("DPTEACH_TEST_OUTPUT", REPO / "test-output")) / "browser"

playwright = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
Image = pytest.importorskip("PIL.Image", reason="Pillow (a matplotlib dependency) is not installed")
pytestmark = browser_marks(pytest)

# Started, not awaited: the cells' prompts say when they have run (ALL_RAN), and a wait that ends tells which
# cell it ended on (NOT_RUN) instead of waiting on a promise that says nothing when it never settles.
RUN_ALL = "() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }"
ALL_RAN = """() => { const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')];
  return prompts.length > 0 && prompts.every(p => /\\[\\d+\\]/.test(p.innerText)); }"""
NOT_RUN = """() => {
  const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  const cells = [...document.querySelectorAll('.jp-CodeCell')];
  const waiting = cells.map((c, i) => [i, c]).filter(([i, c]) => {
    const p = c.querySelector('.jp-InputPrompt'); return !p || !/\\[\\d+\\]/.test(p.innerText); });
  return {kernel: k ? `${k.connectionStatus}/${k.status}` : 'none', cells: cells.length,
          waiting: waiting.map(([i, c]) => `cell ${i} ${(c.querySelector('.jp-InputPrompt') || {}).innerText || ''}: `
            + (c.querySelector('.jp-OutputArea') || {innerText: ''}).innerText.slice(-400))};
}"""
IMAGES = """() => [...document.querySelectorAll('.jp-Notebook img')].map(img => ({
  src: img.src.startsWith('data:image/png') ? img.src : '', complete: img.complete,
  width: img.naturalWidth, height: img.naturalHeight}))"""
PANEL_STATE = """(index) => {
  const panel = document.querySelectorAll('.dpteach-panel')[index];
  const runs = panel.querySelector('.dpteach-status [data-runs]');
  return {status: panel.querySelector('.dpteach-status').innerText, runs: runs ? Number(runs.dataset.runs) : 0,
          stale: panel.querySelector('.dpteach-stale').innerText,
          output: panel.querySelector('.dpteach-output').innerHTML.length};
}"""

# Installed just before a Run click: records, from the page's own clock, when the status first said "running",
# when a progress bar first showed in the live strip, and the fewest outputs the output area held while the
# status said running (an area cleared before the new result is drawn would hold none for a while).
WATCH = """(index) => {
  const panel = document.querySelectorAll('.dpteach-panel')[index];
  const status = panel.querySelector('.dpteach-status'), live = panel.querySelector('.dpteach-live');
  const out = panel.querySelector('.dpteach-output');
  const held = () => out.querySelectorAll('.jp-OutputArea-child').length;
  const rec = {t0: performance.now(), running: null, bar: null, before: held(), fewest: null, ended: null};
  const look = () => {
    const t = performance.now() - rec.t0, running = /running/.test(status.innerText);
    if (running && rec.running === null) rec.running = t;
    if (running) rec.fewest = rec.fewest === null ? held() : Math.min(rec.fewest, held());
    else if (rec.running !== null && rec.ended === null) rec.ended = t;
    if (live && live.querySelector('.widget-hprogress, .widget-vprogress') && rec.bar === null) rec.bar = t;
  };
  const observer = new MutationObserver(look);
  observer.observe(panel, {subtree: true, childList: true, characterData: true, attributes: true});
  window.__dpteachWatch = {rec, observer};
}"""
WATCHED = "() => { window.__dpteachWatch.observer.disconnect(); return window.__dpteachWatch.rec; }"
SHOWS_RUNNING_WITHIN_MS, SHOWS_PROGRESS_AFTER_MS = 1000, 10_000
DIRTY = "() => window.jupyterapp.shell.currentWidget.context.model.dirty"
# Lesson 00's panel then its stale note, followed: the re-run flow a learner meets first
RERUN_FLOW = "00_start_here.ipynb"
# The code cell right after the panel's own cell: the first of "the cells below"; selected, as a learner would.
SELECT_BELOW = """() => {
  const notebook = window.jupyterapp.shell.currentWidget.content;
  const cells = notebook.widgets;
  const panelCell = cells.findIndex(c => c.node.querySelector('.dpteach-panel'));
  const below = cells.findIndex((c, i) => i > panelCell && c.model.type === 'code');
  notebook.activeCellIndex = below;
  return below;
}"""
RUN_BELOW = "() => { window.jupyterapp.commands.execute('notebook:run-all-below'); }"
CELL_TEXT = "(index) => window.jupyterapp.shell.currentWidget.content.widgets[index].node.innerText"


def check_the_run_was_visible(rec: dict, where: str) -> None:
    assert rec["running"] is not None and rec["running"] <= SHOWS_RUNNING_WITHIN_MS, (
        f"{where}: the status said 'running' {rec['running']} ms after the click (at most {SHOWS_RUNNING_WITHIN_MS})")
    if rec["before"]:
        assert rec["fewest"], f"{where}: the output was emptied while the new run was going (the last result vanished)"
    took = (rec["ended"] or 0) - rec["running"]
    if took > SHOWS_PROGRESS_AFTER_MS:
        assert rec["bar"] is not None, f"{where}: ran {took / 1e3:.0f} s with no progress bar under the button"


def change_a_control(panel) -> str:
    """Move the panel's first slider one step (down where it can: the smaller run, as the slider's default is
    sized to the smallest run that shows the point), else pick another option in its first dropdown, else
    tick its first checkbox; returns what was changed."""
    handle = panel.locator(".noUi-handle").first
    if handle.count():
        handle.focus()
        at_low_end = handle.get_attribute("aria-valuenow") == handle.get_attribute("aria-valuemin")
        handle.press("ArrowRight" if at_low_end else "ArrowLeft")
        return "slider"
    select = panel.locator("select").first
    if select.count():
        options = select.locator("option").all_inner_texts()
        current = select.evaluate("s => s.options[s.selectedIndex] ? s.options[s.selectedIndex].text : ''")
        other = next((o for o in options if o != current), None)
        if other is not None:
            select.select_option(label=other)
            return "dropdown"
    box = panel.locator("input[type=checkbox]").first
    if box.count():
        box.click()
        return "checkbox"
    return "nothing"


def ink(grey, box) -> float:
    """The share of pixels in ``box`` darker than light grey."""
    part = grey.crop(box)
    dark = part.point(lambda value: 255 if value < 200 else 0).histogram()[255]
    return dark / max(1, part.size[0] * part.size[1])


def check_figures(page, where: str) -> int:
    images = page.evaluate(IMAGES)
    for number, image in enumerate(images):
        assert image["complete"] and image["width"] > 0, f"{where}: image {number} did not load"
        if not image["src"]:
            continue
        data = base64.b64decode(image["src"].split(",", 1)[1])
        picture = Image.open(io.BytesIO(data))
        picture.load()  # raises on a truncated PNG ("half-drawn")
        assert picture.size == (image["width"], image["height"]), f"{where}: image {number} is not its own size"
        grey = picture.convert("L")
        width, height = grey.size
        upper, lower = ink(grey, (0, 0, width, height // 2)), ink(grey, (0, height // 2, width, height))
        # Every course figure has axes, ticks and labels in both halves (its sparsest measured 2.7% ink).
        # The figures the old panel drew on the button path had a title and nothing else: 0.0-1.2%.
        assert (upper + lower) / 2 > 0.015 and lower > 0.005, (
            f"{where}: image {number} is blank or half-drawn ({upper:.1%} ink above the middle, {lower:.1%} below)")
    return len(images)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lab")
    for name in NOTEBOOKS:  # copies: the committed notebooks are never touched
        shutil.copy(REPO / "notebooks" / name, folder / name)
    align_kernel_metadata([folder / name for name in NOTEBOOKS])  # what `dpteach lab` does before it starts the lab
    OUTPUT.mkdir(parents=True, exist_ok=True)
    env = {"DPTEACH_PROGRESS": str(folder / "progress.json")}
    with jupyterlab(str(folder), env=env) as (url, token):
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
            yield browser, url, token, str(folder)
            browser.close()


def slowest_and_predicting(page, panels) -> list[int]:
    """The panels to press Run on: the one whose run in the notebook took longest ("done in 12.3 s"), and every
    one with a prediction box."""
    took = {}
    for index in range(panels.count()):
        status = page.evaluate(PANEL_STATE, index)["status"]
        found = re.search(r"done in ([0-9.]+) s", status)
        took[index] = float(found.group(1)) if found else 0.0
    predicting = [i for i in took if panels.nth(i).locator(".dpteach-prediction input").count()]
    return sorted({max(took, key=took.get), *predicting}) if took else []


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_a_learner_runs_the_notebook_then_its_slowest_panel_again(lab, notebook, record_property):
    browser, url, token, folder = lab
    started = time.perf_counter()
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        # a workspace of its own, reset: only this notebook open, as a learner opening it would have it
        page.goto(f"{url}/lab/workspaces/{Path(notebook).stem}/tree/{notebook}?token={token}&reset")
        page.wait_for_selector(".jp-Notebook .jp-CodeCell", timeout=90_000)
        page.wait_for_function(KERNEL_IDLE, timeout=90_000)
        assert page.evaluate(DIRTY) is False, f"{notebook} opened marked as modified"
        page.evaluate(RECORD_MESSAGES)  # what the page received and handled, for a Run All that never ends
        record_property("open_s", round(time.perf_counter() - started, 1))  # in the junit report: where time goes
        started = time.perf_counter()
        page.evaluate(RUN_ALL)
        try:  # well inside the test's own time limit, so a cell that never ends is named
            page.wait_for_function(ALL_RAN, timeout=200_000)
        except playwright.TimeoutError:
            state, messages = page.evaluate(NOT_RUN), message_report(page)
            stacks = kernel_stacks(folder)
            shutil.copy(Path(folder) / "jupyterlab.log", OUTPUT / f"{Path(notebook).stem}.jupyterlab.log")
            pytest.fail(f"{notebook}: Run All did not finish in 200 s: {state}\nThe page's messages:\n{messages}\n"
                        f"The kernel's stacks:\n{stacks}\n(the lab's whole log: {OUTPUT})")
        page.wait_for_function(KERNEL_IDLE, timeout=120_000)
        try:  # and the page handled every message it received: none is held behind one whose handling never ended
            page.wait_for_function(ALL_HANDLED, timeout=30_000)
        except playwright.TimeoutError:
            pytest.fail(f"{notebook}: the page did not finish handling the kernel's messages:\n{message_report(page)}")
        record_property("run_all_s", round(time.perf_counter() - started, 1))
        started = time.perf_counter()
        text = page.locator(".jp-Notebook").inner_text()
        assert "Traceback" not in text and "Error displaying widget" not in text, f"{notebook} shows an error"
        check_figures(page, f"{notebook} after Run All")

        panels = page.locator(".dpteach-panel")
        expected = sum("".join(cell["source"]).count("ExperimentPanel(") for cell in json.loads(
            (REPO / "notebooks" / notebook).read_text())["cells"] if cell["cell_type"] == "code")
        assert panels.count() == expected, f"{notebook}: {panels.count()} panels on the page, {expected} in the code"
        for index in slowest_and_predicting(page, panels):
            panel = panels.nth(index)
            panel.scroll_into_view_if_needed()
            runs_before = page.evaluate(PANEL_STATE, index)["runs"]
            box = panel.locator(".dpteach-prediction input")
            if box.count():  # a learner who types words first, then a number
                box.fill("about ten")
                panel.locator(".dpteach-run").click()
                page.wait_for_function(f"() => ({PANEL_STATE})({index}).runs > {runs_before}", timeout=60_000)
                state = page.evaluate(PANEL_STATE, index)
                assert state["status"].startswith("not run"), f"{notebook}, panel {index}: {state['status']}"
                note = panel.locator(".dpteach-prediction-note").inner_text()
                assert "is not allowed: type a number" in note, f"{notebook}, panel {index}: {note!r} beside the box"
                runs_before = state["runs"]
                box.fill("1.5")
            changed = change_a_control(panel)
            page.evaluate(WATCH, index)
            panel.locator(".dpteach-run").click()
            page.wait_for_function(f"() => ({PANEL_STATE})({index}).runs > {runs_before}", timeout=300_000)
            page.wait_for_function(KERNEL_IDLE, timeout=300_000)
            state = page.evaluate(PANEL_STATE, index)
            where = f"{notebook}, panel {index} after its Run button ({changed} changed)"
            check_the_run_was_visible(page.evaluate(WATCHED), where)
            assert state["status"].startswith("done"), f"{where}: {state['status']}"
            assert "earlier result" in state["stale"], f"{where}: no word that the cells below are now stale"
            text = panel.inner_text()
            assert "Traceback" not in text and "Error displaying widget" not in text, f"{where} shows an error"
            check_figures(page, where)
            if box.count():
                score = panel.locator(".dpteach-prediction-score")
                assert score.count() == 1 and "You predicted 1.5" in score.inner_text(), f"{where}: no score"
            if notebook == RERUN_FLOW:
                follow_the_stale_note(page, panel)
        answer_the_first_quiz_item(page, notebook)
        record_property("panels_again_s", round(time.perf_counter() - started, 1))
    finally:
        page.screenshot(path=str(OUTPUT / f"{Path(notebook).stem}.png"), full_page=False)
        page.close()
        shut_down_kernels(url, token)


def follow_the_stale_note(page, panel) -> None:
    """Lesson 00, after its panel ran again with 3 ranks instead of 2: the note says how to bring the cells below up to
    date; the sentence below still speaks of the earlier run until the learner does what the note says - select the
    next cell, Run Selected Cell and All Below - and then it speaks of 3 ranks."""
    note = panel.locator(".dpteach-stale").inner_text()
    assert "earlier result" in note and "Run Selected Cell and All Below" in note, note
    below = page.evaluate(SELECT_BELOW)
    assert "With 2 ranks" in page.evaluate(CELL_TEXT, below)  # not yet: the learner has not run it
    page.evaluate(RUN_BELOW)
    page.wait_for_function(f"() => !({CELL_TEXT})({below}).includes('With 2 ranks')", timeout=120_000)
    page.wait_for_function(KERNEL_IDLE, timeout=120_000)
    text = page.evaluate(CELL_TEXT, below)
    assert "With 3 ranks" in text, text
    assert "Traceback" not in page.locator(".jp-Notebook").inner_text()


def answer_the_first_quiz_item(page, notebook: str) -> None:
    """Where the lesson has a quiz: pick the first option of its first question, submit, and read the feedback."""
    item = page.locator(".dpteach-quiz-item").first
    if not item.count():
        return
    item.scroll_into_view_if_needed()
    wanted = re.search(r"pick (one|\d+)", item.inner_text()).group(1)
    choices = item.locator("input[type=radio], input[type=checkbox]")
    for number in range(1 if wanted == "one" else int(wanted)):  # as many as the question asks for
        choices.nth(number).check()
    item.locator(".dpteach-quiz-submit").click()
    feedback = item.locator(".dpteach-quiz-feedback")
    page.wait_for_function("(el) => el.innerText.trim().length > 0", arg=feedback.element_handle(), timeout=30_000)
    said = feedback.inner_text()
    assert "a right option" in said and "a wrong option" in said, f"{notebook}: the quiz's feedback: {said[:300]}"


def shut_down_kernels(url: str, token: str) -> None:
    """End every kernel the server runs, so the next notebook has the machine to itself."""
    with urllib.request.urlopen(f"{url}/api/kernels?token={token}", timeout=10) as reply:
        kernels = json.load(reply)
    for kernel in kernels:
        request = urllib.request.Request(f"{url}/api/kernels/{kernel['id']}?token={token}", method="DELETE")
        urllib.request.urlopen(request, timeout=30).close()
