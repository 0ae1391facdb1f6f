"""The same commands, unchanged, under torch's own launcher (the way they run across nodes)."""
import json
import subprocess
import sys

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def torchrun(*args, timeout=300):
    return subprocess.run([*TORCHRUN, "-m", "dpteach.cli", *args], capture_output=True, text=True, timeout=timeout)


def test_compare_runs_under_torchrun_and_reports_once():
    out = torchrun("compare", "--steps", "3", "--batch", "8", "--strategies", "local,naive,overlap,ddp", "--json")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    report = json.loads(out.stdout)  # only rank 0 printed: the whole stdout is one JSON object
    assert report["world_size"] == 2 and report["backend"] == "gloo"
    rows = {r["strategy"]: r for r in report["rows"]}
    for name in ("naive", "overlap", "ddp"):
        assert rows[name]["replicas_identical"] and rows[name]["max_abs_diff_vs_single"] <= 1e-5


def test_bench_runs_under_torchrun():
    out = torchrun("bench", "allreduce", "--sizes", "4KiB,64KiB", "--iters", "2", "--json")
    assert out.returncode == 0, out.stderr[-4000:]
    report = json.loads(out.stdout)
    assert report["world_size"] == 2 and len(report["rows"]) == 8


def test_a_world_size_that_contradicts_torchrun_is_refused():
    out = torchrun("compare", "--world-size", "3", "--steps", "2")
    assert out.returncode != 0
    assert "world_size=3 does not match torchrun's WORLD_SIZE=2" in out.stderr
