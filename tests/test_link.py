"""The emulated link on real gloo ranks: exact results, never faster than the link, serialised messages,
no CPU spent waiting, and an honest account of the messages this machine was too slow to emulate."""
import math
import time

import pytest
import torch
import torch.distributed as dist

import dpteach
from dpteach.network.comm import Comm
from dpteach.network.costmodel import collective_time
from dpteach.network import PRESETS, Link, resolve_link

CPU = {"backend": "gloo", "device": "cpu"}
SLOW = Link("slow", alpha_s=0.02, beta_s_per_byte=1e-8)  # 20 ms per message: far slower than loopback


def test_alpha_beta_time_of_each_collective():
    link = Link("l", 1e-3, 1e-9)
    n = 8e6
    assert collective_time("all_reduce", n, 4, link) == pytest.approx(6 * 1e-3 + 2 * 3 / 4 * n * 1e-9)
    for kind in ("all_gather", "reduce_scatter", "all_to_all"):
        assert collective_time(kind, n, 4, link) == pytest.approx(3 * 1e-3 + 3 / 4 * n * 1e-9)
    assert collective_time("all_reduce", n, 1, link) == 0.0
    assert PRESETS["1gbe"].bandwidth_GBps == pytest.approx(0.125)
    assert math.isinf(Link.from_bandwidth("inf", 0.0, math.inf).bandwidth_GBps)


@pytest.mark.parametrize("given, message", [
    ("5gbe", "link='5gbe' is not allowed: choose one of nvlink, pcie, ib, ib_8nics, 10gbe, 1gbe"),
    ({"alpha_s": -1, "beta_s_per_byte": 0}, "link['alpha_s']=-1 is not allowed"),
    ({"alpha_s": 1e-5}, "is not allowed: give a preset name"),
    (3, "link=3 is not allowed"),
])
def test_bad_links_are_named(given, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")):
        resolve_link(given)


def test_presets_and_custom_links_resolve():
    assert resolve_link("ib") is PRESETS["ib"] and resolve_link(None) is None
    custom = resolve_link({"alpha_s": 1e-4, "beta_s_per_byte": 2e-9})
    assert (custom.name, custom.alpha_s, custom.beta_s_per_byte) == ("custom", 1e-4, 2e-9)


def _timed_collectives(link, numel=1000):
    comm = Comm(link, dist.get_world_size())
    x = torch.full((numel,), float(dist.get_rank() + 1))
    start = time.perf_counter()
    comm.all_reduce(x)  # blocking
    blocking = time.perf_counter() - start
    cpu_start, start = time.process_time(), time.perf_counter()
    works = [comm.all_reduce(torch.ones(numel), async_op=True) for _ in range(3)]  # queue on the link
    futures = [w.get_future() for w in works]
    for f in futures:
        f.wait()
    three, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    gathered = [torch.empty(4) for _ in range(dist.get_world_size())]
    comm.all_gather(gathered, torch.full((4,), float(dist.get_rank())))
    return {"sum": x[0].item(), "blocking": blocking, "three": three, "cpu": cpu,
            "async_sum": futures[-1].value()[0][0].item(), "gathered": [g[0].item() for g in gathered],
            "report": comm.report()}


def test_a_slow_link_holds_every_collective_back_and_results_stay_exact():
    ranks = dpteach.launch(_timed_collectives, 2, args=(SLOW,), timeout=120, **CPU)
    cost = collective_time("all_reduce", 4000, 2, SLOW)
    for r in ranks:
        assert r["sum"] == 3.0 and r["async_sum"] == 2.0 and r["gathered"] == [0.0, 1.0]
        assert r["blocking"] >= cost                 # never faster than the link
        assert r["three"] >= 3 * cost                # messages are serialised on the link
        assert r["cpu"] < 0.5 * r["three"]           # the waiting is a sleep, not a busy loop
        assert r["report"]["messages"] == 5 and r["report"]["machine_bound"] == 0
        assert r["report"]["time_set_by"] == "link"
        assert r["report"]["link_seconds"] == pytest.approx(4 * cost + collective_time("all_gather", 32, 2, SLOW))


def test_a_link_faster_than_this_machine_is_reported_as_machine_bound():
    instant = Link("instant", 0.0, 0.0)  # no real transfer can finish in zero seconds
    # 8 MB per all-reduce: milliseconds for real, far beyond the slack a message may finish late by
    # (a 4 KB one can finish within it on an idle machine); the tiny all-gather may still make it
    report = dpteach.launch(_timed_collectives, 2, args=(instant, 2_000_000), timeout=120, **CPU)[0]["report"]
    assert report["messages"] == 5 and report["machine_bound"] >= 4 and report["time_set_by"] == "machine"


def test_without_a_link_comm_is_plain_torch():
    ranks = dpteach.launch(_timed_collectives, 2, args=(None,), timeout=120, **CPU)
    assert all(r["sum"] == 3.0 and r["report"] is None for r in ranks)


def test_the_sharded_strategies_run_on_an_emulated_link_and_stay_exact():
    """zero2 and zero3 launch gloo reduce-scatters without waiting, and gloo's reduce-scatter has no future:
    the link waits for it on a thread of its own instead (a panel of lesson 11 found this)."""
    from dpteach.experiments import compare_strategies
    result = compare_strategies(2, model="mlp", steps=3, batch_per_rank=8, link="10gbe",
                                strategies=("zero1", "zero2", "zero3"), **CPU)
    for row in result["rows"]:
        assert row["max_abs_diff_vs_single"] <= result["tolerance"] and row["replicas_identical"], row["strategy"]
        assert row["link_report"]["messages_per_step"] > 0, row["strategy"]
