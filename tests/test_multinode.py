"""The two-node recipe of docs/clusters.md, run for real: two "machines" with their own network.

Each node is a Linux network namespace with its own address, joined by a virtual Ethernet cable
(veth), so the ranks can reach each other only over that link, as on two hosts. Both run the same
``torchrun --nnodes 2 ... --rdzv-backend c10d`` command; node A hosts the rendezvous. It needs root
and ``ip`` (iproute2); elsewhere it skips with the reason.
"""
import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NODES = (("a", "10.77.0.1"), ("b", "10.77.0.2"))


def _ip(*args, netns=None):
    prefix = ["ip", "netns", "exec", netns] if netns else []
    subprocess.run([*prefix, "ip", *args], check=True, capture_output=True, text=True, timeout=30)


@pytest.fixture
def two_hosts():
    """Two network namespaces joined by a veth pair: {node: (namespace, address, interface)}."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2's ip to make two network namespaces")
    tag = uuid.uuid4().hex[:6]
    hosts = {node: (f"dpteach-{node}-{tag}", address, f"dp{node}{tag}") for node, address in NODES}
    try:
        for namespace, _, _ in hosts.values():
            _ip("netns", "add", namespace)
        (ns_a, _, if_a), (ns_b, _, if_b) = hosts["a"], hosts["b"]
        _ip("link", "add", if_a, "type", "veth", "peer", "name", if_b)
        for namespace, address, interface in hosts.values():
            _ip("link", "set", interface, "netns", namespace)
            _ip("addr", "add", f"{address}/24", "dev", interface, netns=namespace)
            _ip("link", "set", interface, "up", netns=namespace)
            _ip("link", "set", "lo", "up", netns=namespace)
    except subprocess.CalledProcessError as exc:
        for namespace, _, _ in hosts.values():
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
        pytest.skip(f"cannot make network namespaces here: {exc.stderr.strip()}")
    yield hosts
    for namespace, _, _ in hosts.values():  # deleting a namespace also removes its end of the cable
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


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
