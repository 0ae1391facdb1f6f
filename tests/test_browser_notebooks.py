"""Every lesson as a learner meets it in JupyterLab: Run All, then every panel's Run button after changing
one of its controls, in headless Chromium.

For each notebook the test checks what a learner would see:

* no error output and no "Error displaying widget" placeholder anywhere in the notebook;
* every figure, after Run All and after every button run, is a complete PNG (it decodes to the end,
  with the size the page shows, and is not blank);
* every panel's Run button runs again with the changed control and ends "done", and the panel then
  says that the cells below describe the earlier run (``.dpteach-stale``);

and keeps a screenshot per notebook (``test-output/browser/``, or ``$DPTEACH_TEST_OUTPUT/browser``).
"""
from __future__ import annotations

import base64
import io
import json
import os
import shutil
from pathlib import Path

import pytest

from labsession import CHROMIUM_FLAGS, KERNEL_IDLE, browser_marks, chromium_path, jupyterlab

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p.name for p in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
OUTPUT = Path(os.environ.get("DPTEACH_TEST_OUTPUT", REPO / "test-output")) / "browser"

playwright = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
Image = pytest.importorskip("PIL.Image", reason="Pillow (a matplotlib dependency) is not installed")
pytestmark = browser_marks(pytest)

RUN_ALL = "async () => await window.jupyterapp.commands.execute('notebook:run-all-cells')"
NOTHING_RUNNING = """() => ![...document.querySelectorAll('.jp-InputPrompt')].some(p => p.innerText.includes('*'))"""
IMAGES = """() => [...document.querySelectorAll('.jp-Notebook img')].map(img => ({
  src: img.src.startsWith('data:image/png') ? img.src : '', complete: img.complete,
  width: img.naturalWidth, height: img.naturalHeight}))"""
PANEL_STATE = """(index) => {
  const panel = document.querySelectorAll('.dpteach-panel')[index];
  return {status: panel.querySelector('.dpteach-status').innerText,
          stale: panel.querySelector('.dpteach-stale').innerText,
          output: panel.querySelector('.dpteach-output').innerHTML.length};
}"""


def change_a_control(panel) -> str:
    """Move the panel's first slider one step, else pick another option in its first dropdown, else
    tick its first checkbox; returns what was changed."""
    handle = panel.locator(".noUi-handle").first
    if handle.count():
        handle.focus()
        handle.press("ArrowRight")
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
        low, high = picture.convert("L").getextrema()
        assert high - low > 50, f"{where}: image {number} is blank"
    return len(images)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lab")
    for name in NOTEBOOKS:  # copies: the committed notebooks are never touched
        shutil.copy(REPO / "notebooks" / name, folder / name)
    OUTPUT.mkdir(parents=True, exist_ok=True)
    env = {"DPTEACH_PROGRESS": str(folder / "progress.json")}
    with jupyterlab(str(folder), env=env) as (url, token):
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
            yield browser, url, token
            browser.close()


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_a_learner_runs_the_notebook_then_every_panel_again(lab, notebook):
    browser, url, token = lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(f"{url}/lab/tree/{notebook}?token={token}")
        page.wait_for_selector(".jp-Notebook", timeout=90_000)
        page.wait_for_function(KERNEL_IDLE, timeout=90_000)
        page.evaluate(RUN_ALL)
        page.wait_for_function(NOTHING_RUNNING, timeout=300_000)
        page.wait_for_function(KERNEL_IDLE, timeout=300_000)
        text = page.locator(".jp-Notebook").inner_text()
        assert "Traceback" not in text and "Error displaying widget" not in text, f"{notebook} shows an error"
        check_figures(page, f"{notebook} after Run All")

        panels = page.locator(".dpteach-panel")
        expected = sum("".join(cell["source"]).count("ExperimentPanel(") for cell in json.loads(
            (REPO / "notebooks" / notebook).read_text())["cells"] if cell["cell_type"] == "code")
        assert panels.count() == expected, f"{notebook}: {panels.count()} panels on the page, {expected} in the code"
        for index in range(panels.count()):
            panel = panels.nth(index)
            panel.scroll_into_view_if_needed()
            changed = change_a_control(panel)
            panel.locator(".dpteach-run").click()
            page.wait_for_function(f"() => {{ const s = ({PANEL_STATE})({index}).status; "
                                   f"return s.startsWith('done') || s.startsWith('failed'); }}", timeout=300_000)
            page.wait_for_function(KERNEL_IDLE, timeout=300_000)
            state = page.evaluate(PANEL_STATE, index)
            where = f"{notebook}, panel {index} after its Run button ({changed} changed)"
            assert state["status"].startswith("done"), f"{where}: {state['status']}"
            assert "earlier result" in state["stale"], f"{where}: no word that the cells below are now stale"
            text = panel.inner_text()
            assert "Traceback" not in text and "Error displaying widget" not in text, f"{where} shows an error"
            check_figures(page, where)
    finally:
        page.screenshot(path=str(OUTPUT / f"{Path(notebook).stem}.png"), full_page=False)
        page.close()
