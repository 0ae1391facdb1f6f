"""Quiz items drawn from a real run's trace: the picture, the trace it was drawn from and the run that wrote
it are all in the bank, and what each question takes as true can be checked in that trace."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dpteach.quiz.bank import load_bank

REPO = Path(__file__).resolve().parents[1]
FIGURED = [item for item in load_bank(REPO / "quizzes").items if item.figure]


def _spans(item) -> dict:
    """``{rank: spans}`` of the figure's shown run and steps, read from its trace file."""
    events = json.loads(Path(item.figure["trace"]).read_text())["traceEvents"]
    shown = item.figure["run"]["shown"]
    spans = {}
    for e in events:
        if e["ph"] == "X" and e["args"]["run"] in shown["runs"] and e["args"]["step"] in shown["steps"]:
            spans.setdefault(e["pid"], []).append({**e["args"], "name": e["name"], "lane": e["cat"],
                                                   "start": e["ts"], "end": e["ts"] + e["dur"]})
    return spans


def test_three_items_at_least_are_drawn_from_a_trace_and_their_files_are_there():
    assert len(FIGURED) >= 3
    for item in FIGURED:
        assert Path(item.figure["image"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", item.id
        document = json.loads(Path(item.figure["trace"]).read_text())
        assert set(item.figure["run"]["shown"]["runs"]) <= set(document["otherData"]["runs"]), item.id
        assert {e["pid"] for e in document["traceEvents"]} == {0, 1}, item.id  # one process per rank


def _item(item_id):
    return next(item for item in FIGURED if item.id == item_id)


def test_the_wait_span_is_the_compute_standing_still_until_the_buckets_are_in():
    for rank, spans in _spans(_item("overlap-trace-wait-span")).items():
        wait = next(s for s in spans if s["name"] == "wait")
        optimizer = next(s for s in spans if s["name"] == "optimizer")
        backward = max((s for s in spans if s["name"] == "backward"), key=lambda s: s["end"])
        assert backward["end"] <= wait["start"] + 1 and wait["end"] <= optimizer["start"] + 1, rank
        assert any(s["lane"] == "comm" and s["start"] < wait["end"] and s["end"] > wait["start"] for s in spans)
        assert min(s["start"] for s in spans if s["lane"] == "comm") < backward["end"]  # launched during backward


def test_the_bucket_launched_last_is_the_input_side_one_and_is_waited_for():
    for rank, spans in _spans(_item("overlap-trace-last-bucket")).items():
        comm = [s for s in spans if s["lane"] == "comm"]
        wait = next(s for s in spans if s["name"] == "wait")
        last_launched = max(comm, key=lambda s: s["start"])
        assert last_launched["bucket"] == max(s["bucket"] for s in comm), rank
        assert last_launched["end"] > wait["start"], rank  # still on the wire when the rank began to wait


def test_bucketed_sends_nothing_while_backward_runs():
    for rank, spans in _spans(_item("overlap-trace-bucketed-after-backward")).items():
        for step in {s["step"] for s in spans}:
            mine = [s for s in spans if s["step"] == step]
            backward_end = max(s["end"] for s in mine if s["name"] == "backward")
            assert min(s["start"] for s in mine if s["lane"] == "comm") >= backward_end, (rank, step)


@pytest.mark.slow
def test_the_pictures_are_drawn_from_the_traces_alone(tmp_path):
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "quiz_figures.py"), "--draw", "--into", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({Path(i.figure["image"]).name for i in FIGURED})


@pytest.mark.parametrize("item", FIGURED, ids=lambda item: item.id)
def test_the_quiz_shows_the_figure_and_where_it_came_from(item):
    from dpteach.quiz.widget import figure_widgets
    image, source = figure_widgets(item.figure)
    assert image.value[:4] == b"\x89PNG" and "compare_strategies(world_size=2" in source.value
