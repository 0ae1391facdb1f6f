"""The single-GPU check (``dpteach doctor --gpu``) runs the same sequence on the CPU, so its logic is
tested here on every machine; only CUDA itself waits for a GPU (``pytest -m gpu``)."""
import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dpteach.devicecheck.run import OTHER_MODELS, SHARDED, STRATEGIES, WORLDS, all_checks, run_device_checks

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def cpu_report():
    out = subprocess.run([sys.executable, "-m", "dpteach", "doctor", "--full", "--json"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return json.loads(out.stdout)


@pytest.mark.slow
def test_full_check_passes_on_cpu_and_covers_every_world_and_strategy(cpu_report):
    assert cpu_report["ok"] is True and cpu_report["failed"] == [] and cpu_report["device"] == "cpu"
    assert [w["label"] for w in cpu_report["worlds"]] == [label for label, *_ in WORLDS["cpu"]]
    for world in cpu_report["worlds"]:
        assert world["collectives"]["device"] == "cpu"
        assert {r["strategy"] for r in world["compare"]["rows"]} == (
            set(STRATEGIES) - ({"async"} if world["world_size"] < 2 else set()))
        assert world["accumulation"]["accum_steps"] == 2
        assert sorted(world["models"]) == sorted(OTHER_MODELS)
        assert all(table["rows"] and table["device"] == "cpu" for table in world["models"].values())
        algorithms = {r["algorithm"] for r in world["bench"]["rows"]}
        assert {"builtin", "ring", "tree", "naive"} <= algorithms
        assert world["bitwise"]["device"] == "cpu" and world["bitwise"]["world_size"] == world["world_size"]
        assert [r["precision"] for r in world["precision"]["rows"]] == ["fp32", "bf16", "fp16"]
    one, two = cpu_report["worlds"]
    assert [r["strategy"] for r in two["sharded"]["rows"]] == list(SHARDED) and "sharded" not in one
    assert (one["emulated_peers"]["real_ranks"], one["emulated_peers"]["world_size"]) == (1, 8)
    assert "emulated_peers" not in two
    names = [name for name, _ in all_checks(cpu_report)]
    for fragment in ("sharded zero3 within", "precision bf16 drifts", "emulated peers naive waited for the whole"):
        assert any(fragment in name for name in names), fragment
    assert cpu_report["checks"] == len(all_checks(cpu_report)) > 100


@pytest.mark.parametrize("break_it, fragment", [
    (lambda r: r["worlds"][1]["collectives"].update({"ring/float16/7": False}), "gloo_w2: ring/float16/7"),
    (lambda r: r["worlds"][0]["compare"]["rows"][1].update({"max_abs_diff_vs_single": 1e-3}),
     "compare naive within"),
    (lambda r: r["worlds"][1]["accumulation"]["rows"][2].update({"replicas_identical": False}),
     "accumulation ddp replicas identical"),
    (lambda r: r["worlds"][0]["bench"].update({"device": "cuda"}), "bench ran on cuda"),
    (lambda r: r["worlds"][1]["failure"].update({"rank": 0}), "gloo_w2: rank 1's error came home"),
    (lambda r: r["worlds"][1]["models"]["transformer"]["rows"][1].update({"max_abs_diff_vs_single": 2e-4}),
     "transformer overlap within"),
    (lambda r: next(row for row in r["worlds"][1]["bitwise"]["rows"] if row["strategy"] == "deterministic"
                    and row["reference"] == "fixed order").update({"bitwise_equal": False}),
     "gloo_w2: deterministic cnn equals the fixed-order reference bit for bit"),
    (lambda r: r["worlds"][1]["sharded"]["rows"][2].update({"max_abs_diff_vs_single": 1.0}), "sharded zero2 within"),
    (lambda r: r["worlds"][0]["precision"].update({"fp32_vs_single": 1.0}), "gloo_w1: precision fp32 within"),
    (lambda r: next(row for row in r["worlds"][0]["emulated_peers"]["rows"] if row["strategy"] == "naive")
     .update({"exposed_comm_s": 0.0}), "emulated peers naive waited for the whole link time"),
])
@pytest.mark.slow
def test_a_wrong_result_is_named_in_the_failures(cpu_report, break_it, fragment):
    report = copy.deepcopy(cpu_report)
    break_it(report)
    failed = [name for name, ok in all_checks(report) if not ok]
    assert len(failed) == 1 and fragment in failed[0], failed


def test_bad_device_is_refused_before_anything_starts():
    with pytest.raises(ValueError, match=r"device='tpu' is not checkable; choose one of \['cpu', 'cuda'\]"):
        run_device_checks("tpu")


def test_gpu_flag_without_a_gpu_says_why_and_checks_nothing():
    out = subprocess.run([sys.executable, "-m", "dpteach", "doctor", "--gpu"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0
    assert "--gpu needs a CUDA GPU" in out.stderr + out.stdout


@pytest.mark.slow
def test_a_failing_rank_is_checked_in_every_world_of_two_ranks_or_more(cpu_report):
    one, two = cpu_report["worlds"]
    assert "failure" not in one
    assert two["failure"]["rank"] == 1 and two["failure"]["reported"]


@pytest.mark.slow
def test_a_world_that_cannot_form_is_reported_not_counted(cpu_report):
    """What a shared-GPU NCCL world that NCCL refuses leaves in the report: a reason, and no checks."""
    report = copy.deepcopy(cpu_report)
    report["worlds"].append({"label": "nccl_shared_w2", "unavailable": "2 NCCL ranks could not share this GPU"})
    assert all_checks(report) == all_checks(cpu_report)


@pytest.mark.gpu
def test_gpu_check_passes_on_cuda():
    """``scripts/gpu_check.sh`` deselects this: its ``dpteach doctor --gpu`` has just run the same checks."""
    report = run_device_checks("cuda")
    assert report["ok"], report["failed"]
    assert [w["label"] for w in report["worlds"]] == [label for label, *_ in WORLDS["cuda"]]


@pytest.mark.slow
def test_gpu_check_writes_its_report_as_json_and_markdown(cpu_report, tmp_path):
    """scripts/gpu_report.py, fed the CPU run of the same check and a real pytest JUnit file."""
    doctor = copy.deepcopy(cpu_report)
    doctor["worlds"].append({"label": "nccl_shared_w2", "unavailable": "2 NCCL ranks could not share this GPU"})
    doctor["unavailable"] = ["nccl_shared_w2: 2 NCCL ranks could not share this GPU"]
    (tmp_path / "doctor.json").write_text(json.dumps(doctor))
    (tmp_path / "test_tiny.py").write_text("import pytest\ndef test_ok():\n    pass\n"
                                           "@pytest.mark.skip(reason='no GPU')\ndef test_gpu():\n    pass\n")
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_tiny.py"),
                    "--junitxml", str(tmp_path / "junit.xml")], capture_output=True, timeout=120, cwd=tmp_path)
    out = subprocess.run([sys.executable, "scripts/gpu_report.py", "--doctor", str(tmp_path / "doctor.json"),
                          "--junit", str(tmp_path / "junit.xml"), "--seconds", "12", "--out", str(tmp_path / "r")],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads((tmp_path / "r" / "gpu_check_cpu.json").read_text())
    assert report["ok"] and report["tests"]["passed"] == 1 and len(report["tests"]["skipped"]) == 1
    text = (tmp_path / "r" / "gpu_check_cpu.md").read_text()
    assert "**all passed**" in text and "| nccl_shared_w2 | nccl | - | could not form | - |" in text
    assert "not covered: nccl_shared_w2" in text and "| gloo_w2 | compare | overlap |" in text
    missing = subprocess.run([sys.executable, "scripts/gpu_report.py", "--doctor", str(tmp_path / "none.json"),
                              "--junit", str(tmp_path / "junit.xml"), "--seconds", "1", "--out", str(tmp_path / "r2")],
                             capture_output=True, text=True, timeout=60, cwd=REPO)
    assert missing.returncode == 1
    assert "did not finish" in (tmp_path / "r2" / "gpu_check_unknown_gpu.md").read_text()


@pytest.mark.gpu
def test_the_course_reads_each_visible_gpu_as_torch_does():
    """On a real GPU: ``dpteach/ranks/gpus.py`` against torch's own answers (native bf16 with emulation left out)."""
    import torch
    from dpteach.ranks.gpus import read_machine
    machine = read_machine()
    assert machine.count == torch.cuda.device_count()
    for gpu in machine.gpus:
        assert gpu.capability == torch.cuda.get_device_capability(gpu.index)
        with torch.cuda.device(gpu.index):
            assert gpu.native_bf16 == torch.cuda.is_bf16_supported(including_emulation=False)
        for other in range(machine.count):
            if other != gpu.index:
                assert machine.peer[gpu.index][other] == torch.cuda.can_device_access_peer(gpu.index, other)
    assert machine.sixteen_bit()["format"] == ("bf16" if all(g.native_bf16 for g in machine.gpus) else "fp16")
