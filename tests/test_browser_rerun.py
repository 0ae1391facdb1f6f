"""After a second run of a panel, what the stale note tells the learner to do brings the page up to date.

In JupyterLab in headless Chromium: lesson 00 runs all; the learner moves the ranks slider of its
panel from 2 to 3 and presses Run; the panel says the cells below describe an earlier result; the
learner selects the next cell and runs it and all below, as the note says - and the text of that cell
now speaks of 3 ranks. It also checks that a notebook opens unmodified: no edit, no dirty mark.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dpteach.commands.lab import align_kernel_metadata
from labsession import CHROMIUM_FLAGS, KERNEL_IDLE, browser_marks, chromium_path, jupyterlab

REPO = Path(__file__).resolve().parents[1]
playwright = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
pytestmark = browser_marks(pytest)

NOTEBOOK = "00_start_here.ipynb"
RUN_ALL = "async () => await window.jupyterapp.commands.execute('notebook:run-all-cells')"
ALL_RAN = """() => { const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')];
  return prompts.length > 0 && prompts.every(p => /\\[\\d+\\]/.test(p.innerText)); }"""
DIRTY = "() => window.jupyterapp.shell.currentWidget.context.model.dirty"
RUNS = """() => { const s = document.querySelector('.dpteach-panel .dpteach-status [data-runs]');
  return s ? Number(s.dataset.runs) : 0; }"""
# The code cell right after the panel's own cell: the first of "the cells below".
SELECT_BELOW = """() => {
  const notebook = window.jupyterapp.shell.currentWidget.content;
  const cells = notebook.widgets;
  const panelCell = cells.findIndex(c => c.node.querySelector('.dpteach-panel'));
  const below = cells.findIndex((c, i) => i > panelCell && c.model.type === 'code');
  notebook.activeCellIndex = below;
  return below;
}"""
RUN_BELOW = "async () => await window.jupyterapp.commands.execute('notebook:run-all-below')"
CELL_TEXT = "(index) => window.jupyterapp.shell.currentWidget.content.widgets[index].node.innerText"


def test_the_cells_below_a_panel_follow_its_latest_run(tmp_path):
    shutil.copy(REPO / "notebooks" / NOTEBOOK, tmp_path / NOTEBOOK)
    align_kernel_metadata([tmp_path / NOTEBOOK])  # what `dpteach lab` does before it starts JupyterLab
    with jupyterlab(str(tmp_path), env={"DPTEACH_PROGRESS": str(tmp_path / "progress.json")}) as (url, token):
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            try:
                page.goto(f"{url}/lab/workspaces/rerun/tree/{NOTEBOOK}?token={token}&reset")
                page.wait_for_selector(".jp-Notebook .jp-CodeCell", timeout=90_000)
                page.wait_for_function(KERNEL_IDLE, timeout=90_000)
                assert page.evaluate(DIRTY) is False, "the notebook opened marked as modified"
                page.evaluate(RUN_ALL)
                page.wait_for_function(ALL_RAN, timeout=300_000)
                page.wait_for_function(KERNEL_IDLE, timeout=300_000)
                below = page.evaluate(SELECT_BELOW)
                assert "With 2 ranks" in page.evaluate(CELL_TEXT, below)

                panel = page.locator(".dpteach-panel").first
                handle = panel.locator(".noUi-handle").first  # the ranks slider, 2 -> 3
                handle.focus()
                handle.press("ArrowRight")
                panel.locator(".dpteach-run").click()
                page.wait_for_function(f"() => ({RUNS})() >= 2", timeout=300_000)
                page.wait_for_function(KERNEL_IDLE, timeout=300_000)
                note = panel.locator(".dpteach-stale").inner_text()
                assert "earlier result" in note and "Run Selected Cell and All Below" in note, note
                assert "With 2 ranks" in page.evaluate(CELL_TEXT, below)  # not yet: the learner has not run it

                assert page.evaluate(SELECT_BELOW) == below
                page.evaluate(RUN_BELOW)
                page.wait_for_function(f"() => !({CELL_TEXT})({below}).includes('With 2 ranks')", timeout=120_000)
                page.wait_for_function(KERNEL_IDLE, timeout=120_000)
                text = page.evaluate(CELL_TEXT, below)
                assert "With 3 ranks" in text, text
                assert "Traceback" not in page.locator(".jp-Notebook").inner_text()
            finally:
                page.close()
                browser.close()
