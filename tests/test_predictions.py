"""Predictions checked against runs: the box a panel shows, the score under the run, the attempt kept in the
learner's progress - and each lesson's question answered from a real run's result."""
import ipywidgets as widgets
import pytest
from IPython.display import HTML, display

from dpteach.progress import ProgressStore
from dpteach.widgets.panel import ExperimentPanel
from dpteach.widgets.prediction import Prediction, parse
from dpteach.widgets.collectives import ALLREDUCE_TIME
from dpteach.widgets.mixed_precision import BF16_SAVING
from dpteach.widgets.sharding import ZERO2_STATE


@pytest.fixture(autouse=True)
def progress(tmp_path, monkeypatch, ipython_shell):
    monkeypatch.setenv("DPTEACH_PROGRESS", str(tmp_path / "progress.json"))
    return ProgressStore()


def _doubling(n):
    print(f"doubling {n}")
    return {"n": n, "doubled": 2 * n}


DOUBLED = Prediction(key="test-doubled", lesson="00", unit="items", question="What is 2n?",
                     measure=lambda result: result["doubled"],
                     explain=lambda result, predicted: f"2 x {result['n']} is {result['doubled']}.")


def _panel():
    return ExperimentPanel("doubling", experiment=_doubling, render=lambda r: display(HTML(f"got {r['doubled']}")),
                           controls={"n": widgets.IntSlider(value=5)}, prediction=DOUBLED)


def test_a_prediction_is_scored_under_the_run_and_kept_in_progress(progress):
    panel = _panel()
    panel.prediction.text.value = "12"
    assert panel.run() == {"n": 5, "doubled": 10}
    score = panel.output.outputs[-1]["data"]["text/html"]
    assert "You predicted <b>12 items</b>" in score and "measured <b>10 items</b>" in score and "20% over" in score
    assert "2 x 5 is 10." in score
    assert panel.prediction.last == {"predicted": 12.0, "measured": 10.0, "error": pytest.approx(0.2)}
    entry = progress.load()["predictions"]["test-doubled"]
    assert (entry["attempts"], entry["last_error"], entry["lesson"]) == (1, pytest.approx(0.2), "00")


def test_an_empty_box_runs_without_a_score_and_a_non_number_runs_nothing(progress):
    panel = _panel()
    panel.run()
    assert panel.error is None and not any("You predicted" in str(o.get("data")) for o in panel.output.outputs)
    assert progress.load()["predictions"] == {}
    panel.prediction.text.value = "about ten"
    panel.run(n=7)
    assert isinstance(panel.error, ValueError)
    assert "prediction='about ten' is not allowed: type a number in items" in str(panel.error)
    texts = "".join(o.get("text", "") for o in panel.output.outputs)
    assert "doubling 7" not in texts and "got 10" in str(panel.output.outputs)  # nothing ran; the last result stays
    assert "prediction=&#x27;about ten&#x27; is not allowed" in panel.prediction.note.value  # said beside the box
    assert panel.status.value.count("not run") == 1
    assert panel.result == {"n": 5, "doubled": 10} and panel.runs == 2
    panel.prediction.text.value = "14"
    assert panel.run(n=7) == {"n": 7, "doubled": 14} and panel.prediction.note.value == ""  # a number clears it


def test_a_computed_value_is_not_called_measured(progress):
    computed = Prediction(key="test-rule", lesson="00", unit="items", question="2n?", obtained="computed",
                          measure=lambda result: result["doubled"], explain=lambda result, predicted: "")
    box = ExperimentPanel("rule", experiment=_doubling, render=lambda r: None, controls={"n": widgets.IntSlider(value=5)},
                          prediction=computed).prediction
    score = box.score(12.0, {"n": 5, "doubled": 10})
    assert "this run computed <b>10 items</b>" in score and "measured" not in score
    assert progress.load()["predictions"]["test-rule"]["attempts"] == 1


@pytest.mark.parametrize("text, value", [("12.5", 12.5), (" 3e-3 ", 3e-3), ("1,024", 1024.0), ("", None)])
def test_numbers_are_read_as_typed(text, value):
    assert parse(text, "ms") == value


@pytest.mark.parametrize("text", ["ten", "inf", "nan", "12 ms"])
def test_anything_else_is_refused_with_the_value_and_the_unit(text):
    with pytest.raises(ValueError, match=f"prediction='{text}' is not allowed: type a .*number in ms"):
        parse(text, "ms")


def _scored(prediction, result, predicted):
    from dpteach.widgets.prediction import PredictionBox
    box = PredictionBox(prediction)
    return box, box.score(predicted, result)


@pytest.mark.slow
def test_lesson_predictions_are_answered_from_real_runs(progress):
    from dpteach.experiments import allreduce_sweep, comm_precision, sharding_memory
    sweep = allreduce_sweep(2, sizes=("64KiB", "1MiB"), algorithms=("ring",), iters=2, backend="gloo", device="cpu")
    box, html = _scored(ALLREDUCE_TIME, sweep, 5.0)
    assert box.last["measured"] == pytest.approx(sweep["measured"]["ring"][-1] * 1e3) and "own fit" in html
    memory = sharding_memory(2, model="mlp", steps=2, backend="gloo", device="cpu")
    box, html = _scored(ZERO2_STATE, memory, 2.0)
    rule = next(r for r in memory["rows"] if r["strategy"] == "zero2")["predicted_state_bytes"] / memory["param_bytes"]
    assert box.last["measured"] == pytest.approx(rule, rel=0.05) and f"{rule:.3g} P" in html  # adam, W=2: 1 + 3/2
    precision = comm_precision(2, model="mlp", steps=2, backend="gloo", device="cpu")
    box, html = _scored(BF16_SAVING, precision, 50.0)
    assert box.last["measured"] == pytest.approx(50.0, abs=0.5) and "2 bytes instead of 4" in html
    assert sorted(progress.load()["predictions"]) == sorted(p.key for p in (ALLREDUCE_TIME, ZERO2_STATE, BF16_SAVING))


@pytest.mark.slow
def test_the_timing_lessons_predictions_are_answered_from_real_runs(progress):
    from dpteach.experiments import accumulation_sweep, bucket_assignment, overlap_timeline, scaling_simulation
    from dpteach.widgets.accumulation import ACCUMULATION_PER_SAMPLE
    from dpteach.widgets.bucketing import BUCKET_COUNT
    from dpteach.widgets.overlap import OVERLAP_EXPOSED
    from dpteach.widgets.scaling import SCALING_EFFICIENCY
    plan = bucket_assignment("mlp", bucket_mb=0.05)
    box, html = _scored(BUCKET_COUNT, plan, 3)
    assert box.last["measured"] == len(plan["buckets"]) > 1 and "last layer first" in html
    overlap = overlap_timeline(2, model="mlp", steps=4, link="1gbe", backend="gloo", device="cpu")
    rows = {row["strategy"]: row for row in overlap["strategies"]}
    box, html = _scored(OVERLAP_EXPOSED, overlap, 0.5)
    assert box.last["measured"] == pytest.approx(rows["overlap"]["exposed_comm_s"] / rows["naive"]["exposed_comm_s"])
    assert "naive sent" in html
    sweep = accumulation_sweep(2, accum_steps_list=(1, 4), model="mlp", steps=4, link="1gbe", backend="gloo",
                               device="cpu")
    box, html = _scored(ACCUMULATION_PER_SAMPLE, sweep, 0.25)
    assert box.last["measured"] > 0 and "exactly 1/K" in html and "fell to 0.25 of K=1's" in html
    simulated = scaling_simulation(max_world_size=64, links=("nvlink", "ib_8nics"))
    box, html = _scored(SCALING_EFFICIENCY, simulated, 90.0)
    assert box.last["measured"] == pytest.approx(100 * simulated["curves"][list(simulated["curves"])[1]][-1]["efficiency"])
    assert "At W=64" in html
    assert len(progress.load()["predictions"]) == 4
