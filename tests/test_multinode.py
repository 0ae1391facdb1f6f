"""The two-node recipe of docs/clusters.md, run for real: two "machines" with their own network.

Each node is a Linux network namespace with its own address, joined by a virtual Ethernet cable
(veth), so the ranks can reach each other only over that link, as on two hosts. Both run the same
``torchrun --nnodes 2 ... --rdzv-backend c10d`` command; node A hosts the rendezvous. It needs root
and ``ip`` (iproute2); elsewhere it skips with the reason (the ``two_hosts`` fixture, tests/conftest.py).
"""
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_compare_runs_across_two_nodes_with_a_c10d_rendezvous(two_hosts):
    endpoint = f"{two_hosts['a'][1]}:29400"
    nodes = {}
    for node, (namespace, address, interface) in two_hosts.items():
        command = ["ip", "netns", "exec", namespace, "env", f"GLOO_SOCKET_IFNAME={interface}",
                   sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                   "--rdzv-id", "two-node-test", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
                   # an address is not this machine's hostname, so say which node hosts the rendezvous
                   "--rdzv-conf", f"is_host={int(node == 'a')}", "--local-addr", address,
                   "-m", "dpteach.cli", "compare", "--steps", "3", "--batch", "8",
                   "--strategies", "local,naive,overlap,ddp", "--json"]
        nodes[node] = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    outputs = {node: process.communicate(timeout=240) for node, process in nodes.items()}
    for node, process in nodes.items():
        assert process.returncode == 0, f"node {node}: " + outputs[node][1][-3000:]
    printed = [out for out, _ in outputs.values() if out.strip()]
    assert len(printed) == 1, "only global rank 0 reports"
    report = json.loads(printed[0])
    assert report["world_size"] == 2 and report["backend"] == "gloo"
    rows = {r["strategy"]: r for r in report["rows"]}
    for name in ("naive", "overlap", "ddp"):
        assert rows[name]["replicas_identical"] and rows[name]["max_abs_diff_vs_single"] <= 1e-5
