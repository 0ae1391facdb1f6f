"""The GPUs learners have, made up on a machine without any (``simulated_gpus.py``): Kaggle's two T4s without peer
access, Colab's one T4, an eight-A100 NVLink node, one H100, and two RTX 4090s whose peer access hangs NCCL.

For each: what ``dpteach/ranks/gpus.py`` reads, the table ``dpteach doctor`` prints, the 16-bit format lesson 12
trains in and says, the link the panels name, the NCCL settings the launcher adds, and where ``launch`` puts the
ranks. Real ranks cannot run on these GPUs; lesson 12's choice is also run on real CPU ranks, with the
machine's answer standing in for the GPU's.
"""
from __future__ import annotations

import os

import pytest

import dpteach
import dpteach.ranks.launcher
from dpteach.cli import main
from dpteach.ranks.backend import Placement, choose_placement
from dpteach.ranks.gpus import read_machine, settings_for_ranks
from dpteach.widgets.panel import run_notes
from simulated_gpus import MACHINES, simulate
from test_placement import EXPERIMENTS, RecordingRanks, recorded

# kind -> (native bf16, lesson 12's 16-bit format, the link the GPUs share, the variable the course sets)
EXPECTED = {
    "2xT4": (False, "fp16", "host memory (no peer access)", None),
    "1xT4": (False, "fp16", None, None),
    "8xA100": (True, "bf16", "NVLink", None),
    "1xH100": (True, "bf16", None, None),
    "2xRTX4090": (True, "bf16", "host memory (NCCL_P2P_DISABLE=1)", "NCCL_P2P_DISABLE"),
}


@pytest.fixture
def gpus(monkeypatch):
    """``gpus(kind)`` makes torch report that machine for the rest of the test."""
    monkeypatch.delenv("DPTEACH_GPUS", raising=False)
    monkeypatch.delenv("DPTEACH_WORLD_SIZE", raising=False)
    for name in ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE"):
        monkeypatch.delenv(name, raising=False)
    return lambda kind: simulate(kind, monkeypatch.setattr)


@pytest.mark.parametrize("kind", EXPECTED)
def test_the_machine_is_read_as_torch_reports_it(gpus, kind):
    spec = gpus(kind)
    bf16, sixteen, link, setting = EXPECTED[kind]
    machine = read_machine()
    assert machine.count == spec["gpus"]
    assert all(g.native_bf16 == bf16 and g.fp16_tensor_cores for g in machine.gpus)
    assert all(g.capability == spec["capability"] and g.memory_bytes == spec["memory"] for g in machine.gpus)
    assert machine.sixteen_bit()["format"] == sixteen
    assert machine.sixteen_bit()["bf16"] == ("native" if bf16 else "emulated")
    if link:
        assert machine.link_phrase() == link
    assert [s.name for s in machine.nccl_settings()] == ([setting] if setting else [])


@pytest.mark.parametrize("kind", EXPECTED)
def test_doctor_prints_the_gpus_and_what_each_lesson_shows(gpus, kind, capsys):
    spec = gpus(kind)
    bf16, sixteen, link, setting = EXPECTED[kind]
    assert main(["doctor", "--no-smoke"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    table = lines[next(i for i, line in enumerate(lines) if line.startswith("GPU  name")) + 1:]
    gpu_rows = table[:next(i for i, line in enumerate(table) if line.startswith("between GPUs:"))]
    assert all(spec["name"].removeprefix("NVIDIA ") in row for row in gpu_rows)
    assert len(gpu_rows) == spec["gpus"]
    assert all(("native" if bf16 else "emulated") in row for row in gpu_rows)
    lessons = {line.split()[0]: line for line in out.splitlines()[out.splitlines().index(
        "what each lesson shows on this machine:") + 1:]}
    assert len(lessons) == len(dpteach.course.LESSONS)
    twelve = lessons["12"]
    assert ("fp16 with a loss scale: bf16 is emulated" in twelve) == (sixteen == "fp16")
    assert ("bf16 is native" in twelve) == (sixteen == "bf16")
    if link:  # the lessons that time the link name the one these GPUs share
        for number in ("02", "04", "09"):
            assert f"NCCL between the GPUs over {link}" in lessons[number]
    elif spec["gpus"] == 1:  # one GPU: two ranks share it on gloo, and the emulated peers are offered
        assert "gloo, sharing the one GPU" in lessons["04"] and "emulated peers" in lessons["04"]
    assert (f"set by the course: {setting}=1" in out) == bool(setting)


@pytest.mark.parametrize("kind", EXPECTED)
def test_a_panel_names_the_link_its_nccl_ranks_used(gpus, kind):
    spec = gpus(kind)
    link = EXPECTED[kind][2]
    nccl = {"backend": "nccl", "device": "cuda", "world_size": 2, "real_ranks": 2}
    said = [n for n in run_notes(nccl) if n.startswith("Between the GPUs:")]
    if spec["gpus"] < 2:
        assert said == []
        return
    assert len(said) == 1
    assert link.split(" (")[0] in said[0]
    # nothing to say for gloo ranks or for one rank whose peers are emulated
    assert not any(n.startswith("Between") for n in run_notes({**nccl, "backend": "gloo"}))
    assert not any(n.startswith("Between") for n in run_notes({**nccl, "real_ranks": 1, "world_size": 8}))


def test_the_course_sets_p2p_off_for_cards_that_hang_and_says_so(gpus, monkeypatch, capsys):
    import dpteach.ranks.gpus as module
    gpus("2xRTX4090")
    monkeypatch.setattr(module, "_announced", set())
    nccl = Placement("nccl", "cuda", 2)
    assert settings_for_ranks(nccl) == {"NCCL_P2P_DISABLE": "1"}
    assert "the course sets NCCL_P2P_DISABLE=1" in capsys.readouterr().out
    assert settings_for_ranks(Placement("gloo", "cuda", 2)) == {}  # gloo never uses NCCL's transports
    monkeypatch.setenv("NCCL_P2P_DISABLE", "0")  # the learner's own value wins, and nothing is said
    assert settings_for_ranks(nccl) == {}
    assert read_machine().link_phrase() == "PCIe peer-to-peer"
    gpus("2xT4")  # without peer access there is no P2P to turn off
    monkeypatch.delenv("NCCL_P2P_DISABLE")
    assert settings_for_ranks(nccl) == {}


@pytest.mark.parametrize("kind", EXPECTED)
def test_where_launch_puts_the_ranks(gpus, kind):
    spec = gpus(kind)
    count = spec["gpus"]
    for world_size in (1, 2, 4, 8):
        placement = choose_placement(world_size)
        assert (placement.backend, placement.device_type) == (("nccl", "cuda") if world_size <= count
                                                              else ("gloo", "cuda"))
    if count == 1:  # two NCCL ranks on one GPU are refused, naming the way one GPU shows W
        with pytest.raises(ValueError, match="peers='emulated'"):
            choose_placement(2, backend="nccl")
    assert dpteach.default_world_size() == (min(count, 4) if count >= 2 else max(2, min(4, os.cpu_count())))


def test_lesson_12_marks_emulated_bf16_in_its_run_and_its_table(monkeypatch, capsys):
    """The real experiment on CPU ranks, told what a T4 machine answers: bf16 is kept, marked and labelled."""
    import dpteach.experiments.mixed_precision as lesson
    from dpteach.ranks.gpus import GpuMachine, Gpu
    from dpteach.widgets.mixed_precision import render_precision_drift
    t4 = MACHINES["2xT4"]
    machine = GpuMachine(tuple(Gpu(i, t4["name"], t4["capability"], t4["memory"]) for i in range(2)),
                         ((False, False), (False, False)), None, "2.27.3")
    monkeypatch.setattr(lesson, "sixteen_bit_on", lambda device_type: machine.sixteen_bit())
    monkeypatch.setattr("matplotlib.pyplot.show", lambda *a, **k: None)
    result = lesson.precision_drift(2, model="mlp", steps=4, backend="gloo", device="cpu")
    rows = {r["precision"]: r for r in result["rows"]}
    assert rows["bf16"]["emulated"] and rows["bf16"]["label"] == "bf16 (emulated)"
    assert not rows["fp16"]["emulated"] and not rows["fp32"]["emulated"]
    assert result["sixteen_bit"]["format"] == "fp16"
    render_precision_drift(result)
    out = capsys.readouterr().out
    assert "bf16 (emulated)" in out and "16-bit on this machine: fp16 with a loss scale" in out
    # on CPU ranks, as they really are here, nothing is marked
    monkeypatch.undo()
    plain = lesson.precision_drift(2, model="mlp", steps=4, backend="gloo", device="cpu")
    assert plain["sixteen_bit"]["format"] is None and not any(r["emulated"] for r in plain["rows"])


@pytest.mark.parametrize("kind", EXPECTED)
def test_every_experiment_of_the_course_launches_where_the_rule_says(gpus, kind, monkeypatch):
    """The launcher's side of every lesson on each machine: the world each experiment asks for, recorded, not run."""
    import dpteach.replica.sizing as sizing
    spec = gpus(kind)
    monkeypatch.setattr(dpteach.ranks.launcher, "RankProcesses", RecordingRanks)
    monkeypatch.setattr(dpteach.ranks.launcher, "check_memory_for_ranks", lambda world_size: None)
    capacity = sizing.GpuCapacity(spec["name"], spec["memory"], spec["memory"], spec["tflops"])
    monkeypatch.setattr(sizing, "measure_gpu", lambda index=0: capacity)
    for name, call in EXPERIMENTS.items():
        for world_size in (3, 4) if name == "async_staleness" else (2, 4):
            world = recorded(lambda: call(world_size))
            want = ("nccl", "cuda") if world_size <= spec["gpus"] else ("gloo", "cuda")
            assert (world.world_size, world.placement.backend, world.placement.device_type) == (world_size, *want), name
