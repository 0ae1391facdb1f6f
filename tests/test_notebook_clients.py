"""Every lesson under nbclient - the client behind ``jupyter execute`` and papermill - with a CPU hog beside it;
then, in the same kernel, every option of every panel it built.

nbval (the ``notebooks --nbval-lax`` run) drives the kernel with a blocking client, which never showed the
stall that learners met under ``jupyter execute``: a cell finished in seconds and its reply then sat
unread until the client's time-out (``dpteach/widgets/capture.py`` explains why, and how the panels avoid
it). This test runs each notebook as nbclient does, one process busy-looping on one of the cores the
whole time, and asks two things of every cell:

* it raises nothing (nbclient raises ``CellExecutionError`` on an error output);
* nothing it shows (outputs, widget state) names the practice material's internal file ids;
* every panel's results are in the cells' own outputs: nbclient has no widget manager, so each panel writes its
  values, tables and figures into its cell (``dpteach/front_end.py``), as many as its widget holds;
* the client saw the kernel's reply when the kernel sent it. The kernel stamps its ``execute_reply``;
  a cell whose reply reached the client more than ``STALL_S`` later sat in a stalled client. (A stall
  lasted the whole client time-out - minutes - so the margin is there for a loaded machine, not for
  the measurement.)

The check cells' own statements about timing are what the hog tests too: none may assert what a busy
machine can overturn.

Then every choice of every dropdown and checkbox of the lesson's panels runs, with the sliders at their
cheapest (``dpteach/widgets/options.py``), in the kernel that just ran the lesson, with the hog paused: a
refusal the course makes on purpose would show as an error too, so the rounds only combine choices that
make sense together; anything else that fails is a dead end a learner would find. (One run of the lesson
serves both checks: running every lesson twice cost the suite minutes.)
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
pytestmark = pytest.mark.slow  # every lesson, top to bottom: minutes (not in `make test-fast`)
STALL_S = 20.0
SEED_FILE_ID = re.compile(r"\d{3}_[0-9a-f]{16}\.txt")  # the practice material's file names: not for learners
CELL_TIMEOUT_S = 300
SWEEP_TIMEOUT_S = 900
# Before the sweep: what each panel's output area holds after the lesson's runs (its last run)
SHOWN = """
import json
from dpteach.widgets import ExperimentPanel
def _kinds(items):
    return {"figures": sum("image/png" in item.get("data", {}) for item in items),
            "tables": sum("<table" in item.get("data", {}).get("text/html", "") for item in items)}
print("SHOWN" + json.dumps({p.title: {"runs": p.runs, **_kinds(p.output.outputs)} for p in ExperimentPanel.every_panel()}))
"""
SWEEP = """
import json
from dpteach.widgets import ExperimentPanel
from dpteach.widgets.options import run_every_option
print("OPTIONS" + json.dumps(run_every_option(ExperimentPanel.every_panel())))
"""


@pytest.fixture(scope="module")
def cpu_hog():
    """One process spinning on a core for as long as the module's tests run."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    yield hog
    hog.kill()
    hog.wait()


@pytest.mark.timeout(CELL_TIMEOUT_S + SWEEP_TIMEOUT_S)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_the_notebook_runs_under_nbclient_beside_a_cpu_hog_then_every_panel_option_runs(path, cpu_hog,
                                                                                        record_property):
    notebook = nbformat.read(path, as_version=4)
    started = time.perf_counter()
    client = NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3", record_timing=True,
                            resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    late = []
    sweep = nbformat.v4.new_code_cell(SWEEP)
    with client.setup_kernel():
        for index, cell in enumerate(notebook.cells):
            if cell.cell_type != "code":
                continue
            client.execute_cell(cell, index)
            seen = time.time()
            replied = datetime.fromisoformat(cell.metadata["execution"]["shell.execute_reply"]).timestamp()
            if seen - replied > STALL_S:
                late.append(f"cell {index}: the kernel replied, and the client saw it {seen - replied:.0f} s later")
        assert cpu_hog.poll() is None, "the CPU hog stopped early: this run was not under load"
        record_property("lesson_s", round(time.perf_counter() - started, 1))  # in the junit report: where time goes
        shown = json.dumps([cell.get("outputs", []) for cell in notebook.cells]) + json.dumps(
            notebook.metadata.get("widgets", {}))
        if "ExperimentPanel(" in path.read_text():
            counted = nbformat.v4.new_code_cell(SHOWN)
            notebook.cells.append(counted)
            client.execute_cell(counted, len(notebook.cells) - 1)
            text = "".join(o.get("text", "") for o in counted.outputs if o.get("output_type") == "stream")
            check_plain_outputs(path.name, notebook.cells[:-1], json.loads(text[text.index("SHOWN") + 5:].splitlines()[0]))
            os.kill(cpu_hog.pid, signal.SIGSTOP)  # the options run unloaded: they test choices, not load
            try:
                client.timeout = SWEEP_TIMEOUT_S
                notebook.cells.append(sweep)
                swept = time.perf_counter()
                client.execute_cell(sweep, len(notebook.cells) - 1)
                record_property("options_s", round(time.perf_counter() - swept, 1))
            finally:
                os.kill(cpu_hog.pid, signal.SIGCONT)
    assert not late, f"{path.name} stalled under nbclient:\n" + "\n".join(late)
    assert not SEED_FILE_ID.search(shown), f"{path.name} shows an internal file id to learners"
    if sweep.get("outputs") is not None and "ExperimentPanel(" in path.read_text():
        text = "".join(o.get("text", "") for o in sweep.outputs if o.get("output_type") == "stream")
        report = json.loads(text[text.index("OPTIONS") + len("OPTIONS"):].splitlines()[0])
        slowest = sorted(report["took"], key=lambda run: -run["seconds"])[:3]
        record_property("slowest_options", json.dumps(slowest))
        assert report["errors"] == [], json.dumps(report["errors"], indent=1)
        for panel, controls in report["offered"].items():
            for name, values in controls.items():
                assert sorted(report["covered"][panel][name]) == sorted(values), (panel, name)
        assert report["runs"] + report["already_ran"] > 0 or not any(report["offered"].values())


def check_plain_outputs(name: str, cells, panels: dict) -> None:
    """nbclient draws no widgets, so every panel wrote its runs into its cell (``dpteach/front_end.py``): each
    panel's last run there, under the line with its values, shows as many figures and tables as its widget holds;
    and every figure in the notebook carries its description (``dpteach/widgets/figure_text.py``)."""
    blocks = {}  # title -> the figures and tables under the last "TITLE - run N:" line
    for cell in cells:
        current = None
        for item in cell.get("outputs", []):
            for line in item.get("text", "").splitlines() if item.get("output_type") == "stream" else ():
                title = next((t for t in panels if line.startswith(f"{t} - run ")), None)
                if title:
                    current = blocks[title] = {"figures": 0, "tables": 0}
            if "image/png" in item.get("data", {}):  # every figure is stored with what it shows, in words
                said = item.get("metadata", {}).get("image/png", {}).get("alt", "")
                assert len(said) > 20 and item["data"].get("text/plain") == said, (name, said[:200])
            if current is not None and item.get("output_type") == "display_data":
                current["figures"] += "image/png" in item.get("data", {})
                current["tables"] += "<table" in item.get("data", {}).get("text/html", "")
    for title, held in panels.items():
        if held["runs"] == 0:
            continue
        assert title in blocks, f"{name}: the panel {title!r} ran, and its results are not in the notebook's outputs"
        assert blocks[title] == {"figures": held["figures"], "tables": held["tables"]}, (name, title, blocks[title], held)
