"""The two-node recipe of docs/clusters.md, run for real: two "machines" with their own network.

Each node is a Linux network namespace with its own address, joined by a virtual Ethernet cable
(veth), so the ranks can reach each other only over that link, as on two hosts. Both run the same
``torchrun --nnodes 2 ... --rdzv-backend c10d`` command; node A hosts the rendezvous. It needs root
and ``ip`` (iproute2); elsewhere it skips with the reason (the ``two_hosts`` fixture, tests/shaped_link.py).
"""
import pytest

from shaped_link import compare_over_the_cable


@pytest.mark.slow
def test_compare_runs_across_two_nodes_with_a_c10d_rendezvous(two_hosts):
    report, printers = compare_over_the_cable(two_hosts, ["--steps", "3", "--batch", "8",
                                                          "--strategies", "local,naive,overlap,ddp"], pin=False)
    assert printers == 1, "only global rank 0 reports"
    assert report["world_size"] == 2 and report["backend"] == "gloo"
    rows = {r["strategy"]: r for r in report["rows"]}
    for name in ("naive", "overlap", "ddp"):
        assert rows[name]["replicas_identical"] and rows[name]["max_abs_diff_vs_single"] <= 1e-5
