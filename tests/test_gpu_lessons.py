"""``scripts/gpu_lessons.py``, the run of every lesson on a GPU machine, rehearsed here on the CPU: it runs a
real lesson in a real kernel, records every panel's numbers, reports the checks that held, and keeps to
its time budget; the panels' records are plain data written whole."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dpteach.widgets.record import plain, record_run

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import gpu_lessons  # noqa: E402


def test_a_record_is_plain_data_written_whole(tmp_path, monkeypatch):
    assert record_run("nothing set", {}, {"x": 1}, None, 0.1) is None  # no folder: no file
    monkeypatch.setenv("DPTEACH_RECORD_DIR", str(tmp_path))
    result = {"rows": [{"strategy": "naive", "step_time_s": 0.5}], "params": torch.zeros(3), "losses": list(range(100)),
              "model_choice": {"name": "mlp", "params": 1089034}, "nan": float("nan"), "spans": {0: []}}
    path = record_run("Overlap: timelines", {"world_size": 2}, result, None, 1.5)
    record = json.loads(Path(path).read_text())
    assert record["title"] == "Overlap: timelines" and record["values"] == {"world_size": 2}
    got = record["result"]
    assert got["rows"] == [{"strategy": "naive", "step_time_s": 0.5}] and "spans" not in got
    assert "params" not in got and got["model_choice"]["params"] == 1089034  # weights are not data; a count is
    assert len(got["losses"]) == 41 and got["losses"][20] == "..." and got["nan"] == "nan"
    assert [p.name for p in tmp_path.iterdir()] == [Path(path).name]  # no temporary file left behind
    assert plain(torch.tensor(2.5)) == 2.5


@pytest.mark.slow
def test_a_lesson_runs_in_a_kernel_and_its_panels_and_checks_are_reported(tmp_path):
    out = subprocess.run([sys.executable, "scripts/gpu_lessons.py", "--lessons", "00", "--budget", "300",
                          "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_lessons_cpu.json").read_text())
    (lesson,) = report["lessons"]
    assert lesson["notebook"] == "00_start_here.ipynb" and lesson["status"] == "passed" and report["ok"]
    assert lesson["asserts_held"] > 0 and lesson["error"] is None
    assert lesson["panels"] and all(p["error"] is None and p["seconds"] > 0 for p in lesson["panels"])
    assert "# Every lesson on CPU" in (tmp_path / "gpu_lessons_cpu.md").read_text()


def test_lessons_that_do_not_fit_the_budget_are_reported_not_run(tmp_path):
    out = subprocess.run([sys.executable, "scripts/gpu_lessons.py", "--lessons", "04,12", "--budget", "1",
                          "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    report = json.loads((tmp_path / "gpu_lessons_cpu.json").read_text())
    assert [(lesson["notebook"], lesson["status"]) for lesson in report["lessons"]] == [
        ("04_overlap.ipynb", "not run"), ("12_mixed_precision.ipynb", "not run")]
    assert "out of time" in report["lessons"][0]["failure"] and not report["ok"]


def test_the_bars_are_read_from_the_lessons_own_records():
    lessons = [
        {"notebook": "04_overlap.ipynb", "panels": [{"title": "Overlap", "model": "transformer-110m", "link": "ib",
                                                     "peers_note": "1 GPU + 7 emulated peers", "rows": [
            {"strategy": "naive", "exposed_comm_s": 0.040}, {"strategy": "overlap", "exposed_comm_s": 0.010}]}]},
        {"notebook": "12_mixed_precision.ipynb", "panels": [{"title": "Precision: drift", "model": "transformer-110m",
                                                             "params": 111e6, "rows": [
            {"precision": "fp32", "step_vs_fp32": 1.0}, {"precision": "bf16", "step_vs_fp32": 0.3}]}]},
    ]
    bars = gpu_lessons.issue_bars(lessons)
    assert bars["overlap_hides_of_naive"]["value"] == pytest.approx(0.75)
    assert bars["bf16_step_vs_fp32"]["value"] == 0.3 and bars["bf16_step_vs_fp32"]["model"] == "transformer-110m"
    assert gpu_lessons.issue_bars([]) == {}
