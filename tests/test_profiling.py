"""`dpteach profile` and `dpteach diagnose` (lesson 17): recording every rank of an unedited job, reading the traces,
refusing bad ones with their reason, and naming each planted problem with its lesson.

The planted jobs are real: the course's DDP script under torchrun on 2 gloo ranks (a core each here; lesson 17's
benchmark, `benchmarks/diagnose_planted.py`, runs them on 4), profiled by the command line exactly as a learner's
own job would be. The diagnosis sees only the traces. The tests hold it to what load cannot overturn: a core that
another program shares makes its rank late in earnest, so a late rank is never held against it, while the
problems of a job's structure must be found, or not found, whatever else the machine is doing."""
import json
import os
import pathlib
import random
import shutil
import subprocess
import sys

import pytest

from dpteach.profiling.after_import import call_after_import
from dpteach.profiling.diagnose import THRESHOLD, diagnose
from dpteach.profiling.launch import profile_command
from dpteach.profiling.measures import minus, total, union
from dpteach.profiling.planted import PLANTS
from dpteach.profiling.traces import TraceError, read_traces

EXPECTED = {"tiny-buckets": ("tiny_buckets", "03"), "no-overlap": ("no_overlap", "04"),
            "slow-loader": ("slow_loader_on_one_rank", "08"), "slow-rank": ("straggler", "07"),
            "unused-layers": ("find_unused_parameters", "03")}
WORLD, STEPS = 2, 8


def dpteach(*args, **kw):
    return subprocess.run([sys.executable, "-m", "dpteach", *map(str, args)], capture_output=True, text=True,
                          timeout=kw.pop("timeout", 300), **kw)


# -- intervals, against a grid of microseconds ----------------------------------------------------------------
def test_interval_union_and_difference_agree_with_counting_each_microsecond():
    rng = random.Random(0)
    for _ in range(200):
        spans = [(a, a + rng.randint(0, 15)) for a in (rng.randint(0, 60) for _ in range(rng.randint(0, 6)))]
        holes = [(a, a + rng.randint(0, 15)) for a in (rng.randint(0, 60) for _ in range(rng.randint(0, 6)))]
        covered = {t for a, b in spans for t in range(a, b)}
        hidden = {t for a, b in holes for t in range(a, b)}
        assert total(spans) == len(covered)
        assert total(minus(spans, holes)) == len(covered - hidden)
        merged = union(spans)
        assert all(b0 < a1 for (_, b0), (a1, _) in zip(merged, merged[1:]))  # disjoint, sorted, gaps kept


def test_a_function_runs_once_right_after_its_module_is_first_imported():
    code = ("import sys\nfrom dpteach.profiling.after_import import call_after_import\n"
            "seen = []\ncall_after_import('colorsys', lambda m: seen.append(m.__name__))\n"
            "assert seen == [] and 'colorsys' not in sys.modules\n"
            "import colorsys\nimport colorsys\nassert seen == ['colorsys'], seen\n"
            "assert colorsys.rgb_to_hsv(1, 0, 0)[2] == 1\nprint('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr
    seen = []
    call_after_import("json", lambda m: seen.append(m.__name__))  # already imported here: at once
    assert seen == ["json"]


# -- bad input -------------------------------------------------------------------------------------------------
def _trace(rank=0, world=2, schema=1, steps=True, info=True):
    events = [{"ph": "X", "name": "aten::mm", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 10.0, "dur": 5.0}]
    if steps:
        events.append({"ph": "X", "name": "ProfilerStep#4", "cat": "user_annotation", "pid": 1, "tid": 1,
                       "ts": 0.0, "dur": 50.0})
    doc = {"traceEvents": events}
    if schema is not None:
        doc["schemaVersion"] = schema
    if info:
        doc["distributedInfo"] = {"backend": "gloo", "rank": rank, "world_size": world}
    return doc


BAD = {
    "empty folder": ({}, "no trace in"),
    "not JSON": ({"rank0.json": "{not json"}, "is not a readable JSON trace"),
    "another tool's trace": ({"rank0.json": {"traceEvents": []}}, "no schemaVersion"),
    "another profiler version": ({"rank0.json": _trace(schema=2)}, "schemaVersion 2"),
    "no process group": ({"rank0.json": _trace(info=False)}, "no distributedInfo"),
    "no steps": ({"rank0.json": _trace(steps=False), "rank1.json": _trace(1, steps=False)}, "no ProfilerStep#N"),
    "one rank's trace missing": ({"rank0.json": _trace(0, 4), "rank1.json": _trace(1, 4), "rank3.json": _trace(3, 4)},
                                 "rank 2's trace is missing"),
    "two runs in one folder": ({"rank0.json": _trace(0), "old0.json": _trace(0), "rank1.json": _trace(1)},
                               "are both rank 0"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_folder_that_cannot_be_diagnosed_is_refused_with_its_reason_and_no_traceback(tmp_path, case):
    files, reason = BAD[case]
    for name, content in files.items():
        (tmp_path / name).write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(TraceError, match=reason):
        read_traces(tmp_path)
    out = dpteach("diagnose", tmp_path, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert reason in out.stderr and out.stderr.count("\n") == 1


def test_diagnose_names_a_missing_folder(tmp_path):
    out = dpteach("diagnose", tmp_path / "nowhere", timeout=120)
    assert out.returncode == 2 and "does not exist" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("kwargs, names", [({"command": []}, "command=[]"), ({"steps": 0}, "steps=0"),
                                           ({"skip": -1}, "skip=-1"), ({"command": ["no-such-program-x"]},
                                                                       "command='no-such-program-x'")])
def test_profile_refuses_bad_arguments_before_running_anything(tmp_path, kwargs, names):
    args = {"command": [sys.executable, "-c", "pass"], "out": str(tmp_path / "t"), **kwargs}
    with pytest.raises(ValueError, match=names.replace("[", r"\[").replace("]", r"\]")):
        profile_command(**args)
    assert not (tmp_path / "t").exists()


def test_profile_says_when_the_command_fails_or_never_steps_an_optimizer(tmp_path):
    failed = dpteach("profile", "--out", tmp_path / "a", "--", sys.executable, "-c", "raise SystemExit(3)")
    assert failed.returncode == 1 and "exited with code 3" in failed.stderr, failed.stderr
    idle = dpteach("profile", "--out", tmp_path / "b", "--", sys.executable, "-c", "print('no training here')")
    assert idle.returncode == 1 and "no rank wrote a trace" in idle.stderr and "no training here" in idle.stdout


# -- real jobs ---------------------------------------------------------------------------------------------------
# What a trace shows of timing depends on the machine: a core that another program shares (or that the hypervisor
# gives less of) makes its rank truly late, and the diagnosis rightly calls it a straggler - of a job with nothing
# planted, too. Which findings load can and cannot bring about:
LATE_RANK = {"straggler", "slow_loader_on_one_rank"}  # a rank late at the first collective: any busy core can
# ... while the structure of the job - how many all-reduces, whether DDP searched for unused parameters, whether
# the gradients were sent only after backward - is the same on a busy machine as on a quiet one.


def profile_planted(folder: pathlib.Path, plant: str) -> pathlib.Path:
    """Profile the planted job into ``folder`` with the command line, as a learner would."""
    shutil.rmtree(folder, ignore_errors=True)
    out = dpteach("profile", "--out", folder, "--steps", STEPS, "--", sys.executable, "-m",
                  "torch.distributed.run", "--nproc-per-node", WORLD, "-m", "dpteach.profiling.planted",
                  "--plant", plant, "--steps", 3 + 1 + STEPS + 2)
    assert out.returncode == 0, out.stderr[-3000:]
    return folder


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> dict[str, pathlib.Path]:
    """Every plant profiled once."""
    base = tmp_path_factory.mktemp("planted")
    return {plant: profile_planted(base / plant, plant) for plant in PLANTS}


@pytest.mark.slow
@pytest.mark.parametrize("plant", PLANTS)
def test_each_planted_problem_is_found_with_its_lesson_and_a_healthy_job_shows_no_problem_of_structure(planted, plant):
    """Each plant is named with its lesson, before anything load alone could raise; a healthy job raises no
    finding about its structure. (How often a quiet machine's healthy job raises nothing at all is the benchmark's
    to say: ``benchmarks/diagnose_planted.py`` counts it over rounds.)"""
    out = dpteach("diagnose", planted[plant], "--json", timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    found = [(f["kind"], f["lesson"]) for f in result["findings"]]
    assert all(f["cost"] >= THRESHOLD for f in result["findings"])
    assert result["job"]["world_size"] == WORLD and result["job"]["steps"] == STEPS
    if plant == "healthy":
        assert {kind for kind, _ in found} <= LATE_RANK, (result["findings"], result["ranks"])
        return
    expected_kind = EXPECTED[plant][0]
    # a late rank the plant did not make may come first (a busy core); nothing else may
    first = next(f for f in found if f[0] not in LATE_RANK - {expected_kind}) if found else None
    assert first == EXPECTED[plant], (plant, result["findings"], result["ranks"])
    finding = next(f for f in result["findings"] if f["kind"] == expected_kind)
    if plant in ("slow-loader", "slow-rank"):  # the planted rank is the last one, and it is named
        # 40 ms planted in a step of about 10: no busy core makes another rank later than that
        assert finding["rank"] == WORLD - 1 and result["job"]["slowest_rank"] == WORLD - 1, result["findings"]
    if plant == "unused-layers":  # the spare branch: 4 linear layers, a weight and a bias each
        assert finding["unused_tensors"] == 8
    if plant == "tiny-buckets":
        assert result["job"]["all_reduces_per_step"] >= 8 * 2


@pytest.mark.slow
def test_the_merged_trace_has_one_process_per_rank_and_hta_reads_back_every_span(planted, tmp_path):
    from hta.common.trace_parser import parse_trace_dataframe
    from hta.configs.parser_config import ParserConfig
    merged = tmp_path / "all.json"
    out = dpteach("diagnose", planted["slow-loader"], "--merge", merged, timeout=120)
    assert out.returncode == 0 and str(merged) in out.stdout, out.stderr
    document = json.loads(merged.read_text())
    names = {e["pid"]: e["args"]["name"] for e in document["traceEvents"] if e.get("name") == "process_name"}
    assert names == {r: f"rank {r}" for r in range(WORLD)}
    _, frame, symbols = parse_trace_dataframe(str(merged), ParserConfig())
    frame["name"] = frame["name"].map(symbols.get_sym_table().__getitem__)
    for trace in read_traces(planted["slow-loader"]):
        mine = frame[frame["pid"] == trace.rank]
        kept = [e for e in trace.events if e.get("cat") != "Trace"]  # HTA leaves out the profiler's own window span
        assert len(mine) == len(kept)
        steps = mine[mine["name"].str.startswith("ProfilerStep#")].sort_values("ts")
        # HTA reads times in whole microseconds (it rounds the start and the end of ns-resolution events): within 2 us
        for column in ("ts", "dur"):  # ts: ranks of one host keep their clock
            assert len(steps) == len(trace.steps) and all(
                abs(a - float(s[column])) <= 2.0 for a, s in zip(steps[column], trace.steps)), column


@pytest.mark.slow
def test_two_lines_in_the_script_record_the_same_layout(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "from dpteach.profiling import record_steps\n"
        f"record_steps({str(tmp_path / 'traces')!r}, steps=3, skip=1)\n"
        "import torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 4))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(7):\n"
        "    model(torch.randn(8, 16)).sum().backward(); opt.step(); opt.zero_grad()\n"
        "dist.destroy_process_group()\n")
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(script)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert sorted(os.listdir(tmp_path / "traces")) == ["rank0.json", "rank1.json"]
    result = diagnose(tmp_path / "traces")
    assert result["job"]["steps"] == 3 and result["job"]["all_reduces_per_step"] == 1
    assert all(r["collectives_per_step"] == 1 for r in result["ranks"])


# -- the GPU path, on a trace laid out as Kineto lays out a GPU job's ----------------------------------------------
def _gpu_rank(rank):
    """Two steps of 10 ms on one rank, with what HTA needs to place kernels in steps (the launches' correlation
    ids): backward on the CPU launches a compute kernel on stream 7 (0.02-7 ms) and an all-reduce on NCCL's stream
    20 (6-9 ms), so 1 ms of the all-reduce runs under compute and 2 ms are exposed."""
    events = []
    for step in range(2):
        t = step * 10_000.0
        events += [
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step + 4}", "pid": 100, "tid": 100,
             "ts": t, "dur": 10_000.0},
            {"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: AddmmBackward0", "pid": 100,
             "tid": 101, "ts": t + 1_000, "dur": 5_000.0},
            {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 100, "tid": 101, "ts": t + 5_500,
             "dur": 20.0},
            {"ph": "X", "cat": "user_annotation", "name": "nccl:all_reduce", "pid": 100, "tid": 101, "ts": t + 5_510,
             "dur": 10.0, "args": {"Input Dims": [[262144]], "Input type": ["float"]}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": 101, "ts": t + 10,
             "dur": 5.0, "args": {"correlation": 2 * step + 1}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": 101, "ts": t + 5_530,
             "dur": 5.0, "args": {"correlation": 2 * step + 2}},
            {"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_nn", "pid": 0, "tid": 7, "ts": t + 20,
             "dur": 6_980.0, "args": {"correlation": 2 * step + 1, "stream": 7, "device": 0}},
            {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 0, "tid": 20,
             "ts": t + 6_000, "dur": 3_000.0,
             "args": {"correlation": 2 * step + 2, "stream": 20, "device": 0}}]
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2},
            "traceEvents": events}


def test_a_gpu_trace_is_measured_from_its_kernels_and_handed_to_hta(tmp_path):
    for rank in (0, 1):
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(_gpu_rank(rank)))
    result = diagnose(tmp_path)
    assert result["job"]["gpu"] and result["job"]["backend"] == "nccl"
    for r in result["ranks"]:
        assert (r["compute_ms"], r["comm_ms"], r["exposed_comm_ms"], r["idle_ms"]) == (6.98, 3.0, 2.0, 1.02)
        assert r["all_reduces_per_step"] == 1 and r["median_collective_bytes"] == 262144 * 4
    assert result["findings"] == []  # the all-reduce launched during backward: not "no overlap"
    # Holistic Trace Analysis, reading the same files, agrees: a third of the all-reduce ran under compute kernels,
    # and the exposed part is the kernel time that is not compute
    overlap = {row["rank"]: row["comp_comm_overlap_pctg"] for row in result["hta"]["comm_comp_overlap"]}
    assert overlap == {0: pytest.approx(100 / 3, abs=0.01), 1: pytest.approx(100 / 3, abs=0.01)}
    for row in result["hta"]["temporal_breakdown"]:
        assert row["non_compute_time_pctg"] == pytest.approx(100 * 2.0 / (6.98 + 2.0), abs=0.01)
