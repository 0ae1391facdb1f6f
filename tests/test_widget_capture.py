"""``write_into``: what a panel's run prints and displays lands in its ``Output`` as state written by the
kernel, never by asking the front end to route messages (the round trip that stalls nbclient)."""
import sys

import ipywidgets as widgets
import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.display import HTML, display

from dpteach.widgets.capture import write_into
from dpteach.widgets.panel import ExperimentPanel


@pytest.fixture(autouse=True)
def shell(ipython_shell):
    return ipython_shell


def test_prints_and_displays_land_in_the_output_in_order():
    out = widgets.Output()
    with write_into(out):
        print("first line")
        print("second line")
        print("a warning", file=sys.stderr)
        display(HTML("<b>table</b>"))
        print("after the table")
    kinds = [(item["output_type"], item.get("name")) for item in out.outputs]
    assert kinds == [("stream", "stdout"), ("stream", "stderr"), ("display_data", None), ("stream", "stdout")]
    assert out.outputs[0]["text"] == "first line\nsecond line\n"
    assert out.outputs[2]["data"]["text/html"] == "<b>table</b>"
    assert out.msg_id == ""  # the front end was never asked to route anything


def test_stdout_and_the_display_publisher_are_put_back():
    shell = InteractiveShell.instance()
    before = sys.stdout, sys.stderr, shell.display_pub
    out = widgets.Output()
    with pytest.raises(RuntimeError):
        with write_into(out):
            print("before the error")
            raise RuntimeError("boom")
    assert (sys.stdout, sys.stderr, shell.display_pub) == before
    assert out.outputs[0]["text"] == "before the error\n"


def test_clear_replaces_the_last_run_and_clear_false_appends():
    out = widgets.Output()
    with write_into(out):
        print("run 1")
    with write_into(out):
        print("run 2")
    assert [item["text"] for item in out.outputs] == ["run 2\n"]
    with write_into(out, clear=False):
        display(HTML("extra"))
    assert len(out.outputs) == 2


def test_a_progress_bar_that_closes_itself_leaves_nothing_behind():
    out = widgets.Output()
    with write_into(out):
        kept, closed = widgets.IntProgress(value=1), widgets.IntProgress(value=2)
        display(kept)
        display(closed)
        closed.close()  # what tqdm's notebook bar does with leave=False
    views = [item["data"]["application/vnd.jupyter.widget-view+json"]["model_id"] for item in out.outputs]
    assert views == [kept.model_id]


def test_an_update_replaces_the_display_with_the_same_id():
    out = widgets.Output()
    with write_into(out):
        display(HTML("0%"), display_id="bar")
        display(HTML("100%"), display_id="bar", update=True)
    assert [item["data"]["text/html"] for item in out.outputs] == ["100%"]


def test_the_panel_writes_its_run_and_its_errors_into_its_output():
    def experiment(n):
        print(f"running with n={n}")
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        return {"n": n}

    panel = ExperimentPanel("t", experiment=experiment, render=lambda result: display(HTML(f"n is {result['n']}")),
                            controls={"n": widgets.IntSlider(value=3)})
    assert panel.run() == {"n": 3}
    assert [item["output_type"] for item in panel.output.outputs] == ["stream", "display_data"]
    assert panel.output.outputs[1]["data"]["text/html"] == "n is 3"
    panel.run(n=-1)
    texts = "".join(item.get("text", "") for item in panel.output.outputs)
    assert "ValueError: n must be >= 0, got -1" in texts and "running with n=-1" in texts
    assert panel.output.msg_id == ""


def test_a_second_run_marks_the_cells_below_as_describing_an_earlier_run():
    panel = ExperimentPanel("t", experiment=lambda ranks: {"ranks": ranks}, render=lambda result: None,
                            controls={"ranks": widgets.IntSlider(value=2, description="ranks W")})
    panel.run()
    assert panel.stale.value == ""  # the cells below were written from this very run
    panel.controls["ranks"].value = 3
    panel.button.click()
    assert "earlier result" in panel.stale.value and "ranks W 2 &rarr; 3" in panel.stale.value


def test_a_second_run_keeps_the_last_result_greyed_and_shows_its_progress_above_it_until_replaced():
    seen = {}

    def experiment(n):
        print(f"step 1 of {n}")  # what a run prints while it goes: visible in the live strip at once
        seen["status"] = panel.status.value
        seen["old"] = [item.get("data", {}).get("text/html") for item in panel.output.outputs]
        seen["classes"] = list(panel.output._dom_classes)
        seen["live"] = "".join(item.get("text", "") for item in panel.live.outputs)
        return {"n": n}

    panel = ExperimentPanel("t", experiment=experiment, render=lambda result: display(HTML(f"n is {result['n']}")),
                            controls={"n": widgets.IntSlider(value=3)})
    panel.run()
    assert "dpteach-replacing" not in seen["classes"]  # nothing to grey on the first run
    panel.run(n=4)
    assert "running" in seen["status"]
    assert "n is 3" in seen["old"] and "dpteach-replacing" in seen["classes"]  # the last result stayed, greyed
    assert "step 1 of 4" in seen["live"]
    # replaced: what the run printed, then its result; the strip is empty and the output no longer greyed
    assert [item["output_type"] for item in panel.output.outputs] == ["stream", "display_data"]
    assert panel.output.outputs[0]["text"] == "step 1 of 4\n" and panel.output.outputs[1]["data"]["text/html"] == "n is 4"
    assert panel.live.outputs == () and "dpteach-replacing" not in panel.output._dom_classes


def test_a_failed_run_replaces_the_greyed_result_with_what_it_printed_and_why_it_failed():
    def experiment(n):
        print("started")
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        return {"n": n}

    panel = ExperimentPanel("t", experiment=experiment, render=lambda result: display(HTML("drawn")),
                            controls={"n": widgets.IntSlider(value=3, min=-5)})
    panel.run()
    panel.run(n=-1)
    texts = "".join(item.get("text", "") for item in panel.output.outputs)
    assert "drawn" not in str(panel.output.outputs) and texts == "started\nValueError: n must be >= 0, got -1\n"
    assert "dpteach-replacing" not in panel.output._dom_classes and panel.live.outputs == ()


def test_the_stale_note_names_changed_values_in_words_not_python():
    panel = ExperimentPanel("t", experiment=lambda faults, link: {}, render=lambda result: None,
                            controls={"faults": widgets.SelectMultiple(options=["kill", "hang", "raise"],
                                                                       value=("kill", "hang"), description="faults"),
                                      "link": widgets.Dropdown(options=[("none", None), ("1gbe", "1gbe")], value=None,
                                                               description="link")})
    panel.run()
    panel.controls["faults"].value = ("kill", "hang", "raise")
    panel.controls["link"].value = "1gbe"
    panel.run()
    assert "faults kill, hang &rarr; kill, hang, raise" in panel.stale.value
    assert "link none &rarr; 1gbe" in panel.stale.value and "(" not in panel.stale.value.split("changed:")[1][:40]


def test_a_render_that_fails_halfway_keeps_what_it_drew_before_the_error():
    def render(result):
        display(HTML("first figure"))
        raise RuntimeError("the second figure could not be drawn")

    panel = ExperimentPanel("t", experiment=lambda: {"n": 1}, render=render)
    panel.run()
    assert panel.output.outputs[0]["data"]["text/html"] == "first figure"
    assert panel.output.outputs[-1]["text"] == "RuntimeError: the second figure could not be drawn\n"
