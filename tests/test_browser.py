"""A learner's session in a real browser: JupyterLab on localhost, headless Chromium, a course notebook.

Run all cells, move a slider of the notebook's experiment panel and press its Run button, check that
the output changed, answer a quiz item and check that its feedback appears, and keep a screenshot
(``test-output/browser/`` at the repository root, or ``DPTEACH_TEST_OUTPUT``).
"""
import os
import shutil
from pathlib import Path

import pytest

from labsession import CHROMIUM_FLAGS, KERNEL_IDLE, browser_marks, chromium_path, jupyterlab

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = "00_start_here.ipynb"
OUTPUT = Path(os.environ.get("DPTEACH_TEST_OUTPUT", REPO / "test-output")) / "browser"

playwright = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
pytestmark = browser_marks(pytest)

PANEL_DONE = """(before) => {
  const out = document.querySelector('.dpteach-panel .dpteach-output');
  const status = document.querySelector('.dpteach-panel .dpteach-status');
  return out && status && status.innerText.startsWith('done') && out.innerHTML !== before;
}"""


def test_a_learner_runs_a_notebook_moves_a_slider_and_answers_a_quiz(tmp_path):
    shutil.copy(REPO / "notebooks" / NOTEBOOK, tmp_path / NOTEBOOK)  # never touch the committed file
    OUTPUT.mkdir(parents=True, exist_ok=True)
    env = {"DPTEACH_PROGRESS": str(tmp_path / "progress.json"), "DPTEACH_WORLD_SIZE": "2"}
    with jupyterlab(str(tmp_path), env=env) as (url, token):
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            try:
                page.goto(f"{url}/lab/tree/{NOTEBOOK}?token={token}")
                page.wait_for_selector(".jp-Notebook", timeout=90_000)
                page.wait_for_function(KERNEL_IDLE, timeout=90_000)
                page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")

                # the notebook ran: its panel showed a first result
                page.wait_for_function(PANEL_DONE, arg="", timeout=180_000)
                page.wait_for_function(KERNEL_IDLE, timeout=180_000)
                panel = page.locator(".dpteach-panel").first
                before = panel.locator(".dpteach-output").inner_html()

                # move the panel's first slider two steps, then press Run
                handle = panel.locator(".noUi-handle").first
                handle.focus()
                value_before = panel.locator(".widget-readout").first.inner_text()
                page.keyboard.press("ArrowRight")
                page.keyboard.press("ArrowRight")
                page.wait_for_function("(v) => document.querySelector('.dpteach-panel .widget-readout').innerText !== v",
                                       arg=value_before, timeout=10_000)
                panel.locator(".dpteach-run").click()
                page.wait_for_function(PANEL_DONE, arg=before, timeout=180_000)
                assert panel.locator(".dpteach-output").inner_html() != before

                # answer the first quiz item and see its feedback
                item = page.locator(".dpteach-quiz-item").first
                item.scroll_into_view_if_needed()
                choice = item.locator("input[type=radio], input[type=checkbox]").first
                choice.check()
                item.locator(".dpteach-quiz-submit").click()
                feedback = item.locator(".dpteach-quiz-feedback")
                page.wait_for_function("(el) => el.innerText.trim().length > 0", arg=feedback.element_handle(),
                                       timeout=30_000)
                assert "wrong" in feedback.inner_text() or "right" in feedback.inner_text()
            finally:
                page.screenshot(path=str(OUTPUT / "learner_session.png"), full_page=False)
                browser.close()
    assert (OUTPUT / "learner_session.png").stat().st_size > 10_000
