"""A lesson's panel in kernels the course does not control: one that has already touched CUDA, and front ends that
draw no widgets.

Each test runs a small notebook in a real kernel under nbclient (the client of ``jupyter execute`` and papermill,
which has no widget manager), with a real panel whose ranks are real gloo processes.

* **CUDA first.** The kernel makes torch report a T4 and that CUDA is initialised (``simulated_gpus.py``), as a
  learner's kernel is after ``torch.cuda.is_available()`` and a tensor on the GPU. A child forked from such a
  process cannot use CUDA, so the course never forks the kernel: CPU ranks come from the zygote, a fresh
  interpreter started for the purpose (``dpteach/ranks/zygote.py``), GPU ranks are fresh interpreters. The test
  runs a panel and a function defined in the notebook on ranks, and checks that no rank's parent is the kernel.
* **No widget manager.** The panel's table and figure must be in the cell's own outputs, under a line with the
  controls' values (``dpteach/front_end.py``); with ``DPTEACH_WIDGETS=on``, or in a kernel a Jupyter
  server started for a notebook (``JPY_SESSION_NAME``), the panel is a widget and the cell holds no copy.
"""
from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

TESTS = Path(__file__).resolve().parent
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

CELLS = [
    f"""import sys
sys.path.insert(0, {str(TESTS)!r})
from simulated_gpus import simulate
simulate("1xT4", initialised=True)  # this kernel has "used" its GPU
import torch
assert torch.cuda.is_initialized() and torch.cuda.device_count() == 1""",
    """import ipywidgets as widgets
from dpteach.experiments import gradient_equivalence
from dpteach.widgets import ExperimentPanel
from dpteach.widgets.memory import render_equivalence
panel = ExperimentPanel("Averaged gradients", experiment=gradient_equivalence, render=render_equivalence,
                        controls={"batch_per_rank": widgets.IntSlider(value=8, min=4, max=16, step=4,
                                                                      description="batch per rank")},
                        fixed={"world_size": 2, "backend": "gloo", "device": "cpu"})
display(panel)
result = panel.run()""",
    """import os
import dpteach
assert panel.error is None, panel.error
def parent_of_this_rank():  # defined in the notebook: it travels to the ranks by value
    return os.getppid()
parents = dpteach.launch(parent_of_this_rank, 2, backend="gloo", device="cpu")
assert os.getpid() not in parents, (os.getpid(), parents)
print("ranks started apart from the kernel", panel.result["rel_error"] < 1e-5)""",
]


def run_notebook(tmp_path, **env) -> list:
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in CELLS])
    saved = {name: os.environ.get(name) for name in ("DPTEACH_WIDGETS", "JPY_SESSION_NAME", "DPTEACH_GPUS")}
    os.environ.pop("DPTEACH_GPUS", None)  # the kernel's torch reports the T4; the panel asks for CPU ranks itself
    os.environ.pop("JPY_SESSION_NAME", None)
    os.environ.pop("DPTEACH_WIDGETS", None)
    os.environ.update(env)
    try:
        NotebookClient(notebook, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
                       ).execute()
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)
    return [cell.outputs for cell in notebook.cells]


def kinds(outputs) -> set:
    return {mime for item in outputs for mime in item.get("data", {})}


def text_of(outputs) -> str:
    return "".join(item.get("text", "") or item.get("data", {}).get("text/plain", "") for item in outputs)


def test_a_kernel_that_used_cuda_runs_a_panel_and_shows_it_without_widgets(tmp_path):
    cells = run_notebook(tmp_path)
    panel_cell, after = cells[1], cells[2]
    assert "ranks started apart from the kernel True" in text_of(after)
    # no widget manager: the cell itself holds the values, the table and the figure
    assert WIDGET_VIEW not in kinds(panel_cell)
    assert "image/png" in kinds(panel_cell)
    tables = [item["data"] for item in panel_cell if "<table" in item.get("data", {}).get("text/html", "")]
    assert len(tables) == 1 and "average over ranks" in tables[0]["text/plain"]  # and as text, for a text-only viewer
    text = text_of(panel_cell)
    assert "Averaged gradients - run 1: batch per rank=8" in text
    assert "draws no widgets" in text and "DPTEACH_WIDGETS=on" in text
    assert "max |averaged - single process|" in text  # what the renderer printed
    assert "%|" not in text  # progress bars are not kept


@pytest.mark.parametrize("env", [{"DPTEACH_WIDGETS": "on"}, {"JPY_SESSION_NAME": "lesson.ipynb"}],
                         ids=["setting", "jupyter-server-kernel"])
def test_where_widgets_are_drawn_the_cell_holds_the_widget_only(tmp_path, env):
    cells = run_notebook(tmp_path, **env)
    panel_cell = cells[1]
    assert WIDGET_VIEW in kinds(panel_cell)
    assert "image/png" not in kinds(panel_cell)  # the figure is in the widget's output area
    assert "ranks started apart from the kernel True" in text_of(cells[2])


def test_a_wrong_setting_is_refused_naming_it(monkeypatch):
    from dpteach import front_end
    monkeypatch.setenv("DPTEACH_WIDGETS", "maybe")
    with pytest.raises(ValueError, match="DPTEACH_WIDGETS='maybe' is not allowed: it must be one of auto, on, off"):
        front_end.widgets_drawn()


def test_a_quiz_without_widgets_is_its_questions_as_text(monkeypatch):
    import dpteach.quiz
    from dpteach.quiz.bank import load_bank
    monkeypatch.setenv("DPTEACH_WIDGETS", "off")
    bank = load_bank()
    quiz = dpteach.quiz.show("overlap", record=False)
    text = quiz.plain_text()["text/plain"]
    items = bank.topic("overlap")
    assert text.count("\n1. (") == 1 and f"\n{len(items)}. (" in text
    for item in items:  # every stem and every option, and no explanation (they would give the answers away)
        assert item.stem in text and all(option.text in text for option in item.options)
        assert not any(option.explanation in text for option in item.options if option.explanation not in item.stem)
    assert "dpteach quiz --topic overlap" in text
