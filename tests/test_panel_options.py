"""Every option of every panel runs: each lesson top to bottom in a real kernel, then every choice of every
dropdown and checkbox of its panels, with the sliders at their cheapest (``dpteach/widgets/options.py``).
A refusal the course makes on purpose would show as an error here too, so the rounds only combine choices
that make sense together; anything else that fails is a dead end a learner would find."""
import json
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]
WITH_PANELS = sorted(p.name for p in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb")
                     if "ExperimentPanel(" in p.read_text())
SWEEP = """
import json
from dpteach.widgets import ExperimentPanel
from dpteach.widgets.options import run_every_option
print("OPTIONS" + json.dumps(run_every_option(ExperimentPanel.every_panel())))
"""


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("notebook", WITH_PANELS)
def test_every_choice_of_every_panel_runs(notebook):
    nb = nbformat.read(REPO / "notebooks" / notebook, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(SWEEP))
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(REPO / "notebooks")}}).execute()
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.get("output_type") == "stream")
    report = json.loads(text[text.index("OPTIONS") + len("OPTIONS"):].splitlines()[0])
    assert report["errors"] == [], json.dumps(report["errors"], indent=1)
    for panel, controls in report["offered"].items():
        for name, values in controls.items():
            assert sorted(report["covered"][panel][name]) == sorted(values), (panel, name)
    assert report["runs"] > 0 or not any(report["offered"].values())
