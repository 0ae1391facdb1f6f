"""Two "hosts" on one machine joined by a real network cable, and that cable shaped by the kernel.

Each host is a Linux network namespace with an address of its own; a veth pair is the cable between them, so
ranks placed in the two namespaces reach each other only over it, as two machines would. ``tc`` then shapes
both ends to a rate (a token bucket, tbf) and, where the kernel has netem, adds a delay. Used by the two-node
tests (``test_multinode.py``, ``test_link_shaped.py``) and by the benchmark that holds the course's emulated link
against the kernel's shaping (``benchmarks/link_vs_shaped.py``). Needs root and iproute2's ``ip`` and ``tc``.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NODES = (("a", "10.77.0.1"), ("b", "10.77.0.2"))
# The burst must hold one whole segmentation-offload packet (64 kB on a veth); with smaller packets the kernel's
# per-packet work, not the bucket, would cap the rate on a small machine.
BURST_BYTES = 80_000


class CannotMakeHosts(RuntimeError):
    """This machine cannot make the namespaces or shape the cable (not root, no iproute2, a kernel without tbf)."""


def _ip(*args, netns=None):
    prefix = ["ip", "netns", "exec", netns] if netns else []
    subprocess.run([*prefix, "ip", *args], check=True, capture_output=True, text=True, timeout=30)


@contextmanager
def two_hosts():
    """Yield ``{node: (namespace, address, interface)}`` for two namespaces joined by a veth pair; remove them after."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        raise CannotMakeHosts("needs root and iproute2's ip to make two network namespaces")
    tag = uuid.uuid4().hex[:6]
    hosts = {node: (f"dpteach-{node}-{tag}", address, f"dp{node}{tag}") for node, address in NODES}
    try:
        for namespace, _, _ in hosts.values():
            _ip("netns", "add", namespace)
        (_, _, if_a), (_, _, if_b) = hosts["a"], hosts["b"]
        _ip("link", "add", if_a, "type", "veth", "peer", "name", if_b)
        for namespace, address, interface in hosts.values():
            _ip("link", "set", interface, "netns", namespace)
            _ip("addr", "add", f"{address}/24", "dev", interface, netns=namespace)
            _ip("link", "set", interface, "up", netns=namespace)
            _ip("link", "set", "lo", "up", netns=namespace)
    except subprocess.CalledProcessError as exc:
        for namespace, _, _ in hosts.values():
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
        raise CannotMakeHosts(f"cannot make network namespaces here: {exc.stderr.strip()}") from None
    try:
        yield hosts
    finally:
        for namespace, _, _ in hosts.values():  # deleting a namespace also removes its end of the cable
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


def _tc(namespace, *args):
    return subprocess.run(["ip", "netns", "exec", namespace, "tc", *args], capture_output=True, text=True, timeout=30)


def shape(hosts, rate_bits: int, delay_us: int) -> bool:
    """Shape both ends of the cable to ``rate_bits`` per second; True if the kernel could also add the delay
    (netem). Raises ``CannotMakeHosts`` where the kernel cannot shape with tbf."""
    if shutil.which("tc") is None:
        raise CannotMakeHosts("needs iproute2's tc to shape the link")
    with_delay = True
    for namespace, _, interface in hosts.values():
        netem = _tc(namespace, "qdisc", "add", "dev", interface, "root", "handle", "1:", "netem",
                    "delay", f"{delay_us}us")
        parent = ["parent", "1:", "handle", "2:"] if netem.returncode == 0 else ["root"]
        with_delay &= netem.returncode == 0
        tbf = _tc(namespace, "qdisc", "add", "dev", interface, *parent, "tbf", "rate", f"{rate_bits}bit",
                  "burst", str(BURST_BYTES), "latency", "200ms")
        if tbf.returncode != 0:
            raise CannotMakeHosts(f"this kernel cannot shape a link with tc tbf: {tbf.stderr.strip()}")
    return with_delay


def one_way_latency(hosts) -> float:
    """Half the median round trip of a small TCP message between the two namespaces, in seconds."""
    (ns_a, address_a, _), (ns_b, _, _) = hosts["a"], hosts["b"]
    server = ("import socket\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
              f"s.bind(('{address_a}', 29511)); s.listen(1); c, _ = s.accept()\n"
              "c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)\n"
              "while (d := c.recv(64)):\n    c.sendall(d)\n")
    client = ("import socket, statistics, time\n"
              f"c = socket.create_connection(('{address_a}', 29511))\n"
              "c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)\nrtt = []\n"
              "for _ in range(200):\n    t = time.perf_counter(); c.sendall(b'x'); c.recv(64)\n"
              "    rtt.append(time.perf_counter() - t)\nprint(statistics.median(rtt) / 2)\n")
    echo = subprocess.Popen(["ip", "netns", "exec", ns_a, sys.executable, "-c", server])
    try:
        time.sleep(0.5)
        out = subprocess.run(["ip", "netns", "exec", ns_b, sys.executable, "-c", client], capture_output=True,
                             text=True, timeout=60, check=True)
    finally:
        echo.kill()
        echo.wait()
    return float(out.stdout)


def compare_over_the_cable(hosts, arguments: list[str], pin: bool = True) -> tuple[dict, int]:
    """``dpteach compare ARGUMENTS`` on two nodes, one rank in each namespace, joined by torchrun's c10d
    rendezvous over the cable (each rank on a core of its own where ``pin``); its JSON report, and how many
    nodes printed one (only global rank 0 should)."""
    endpoint = f"{hosts['a'][1]}:29400"
    nodes = {}
    cores = sorted(os.sched_getaffinity(0))
    for index, (node, (namespace, address, interface)) in enumerate(hosts.items()):
        # one core and one compute thread per rank, as the launcher gives the emulated run's ranks
        taskset = (["taskset", "-c", str(cores[index])] if pin and len(cores) >= 2 and shutil.which("taskset")
                   else [])
        command = ["ip", "netns", "exec", namespace, *taskset, "env", f"GLOO_SOCKET_IFNAME={interface}",
                   f"OMP_NUM_THREADS={max(1, (os.cpu_count() or 1) // 2)}",
                   sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                   "--rdzv-id", "shaped-link", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
                   # an address is not this machine's hostname, so say which node hosts the rendezvous
                   "--rdzv-conf", f"is_host={int(node == 'a')}", "--local-addr", address,
                   "-m", "dpteach.cli", "compare", *arguments, "--json"]
        nodes[node] = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    outputs = {}
    try:
        outputs = {node: process.communicate(timeout=600) for node, process in nodes.items()}
    finally:
        for process in nodes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
    for node, process in nodes.items():
        if process.returncode != 0:
            raise RuntimeError(f"node {node}: " + outputs[node][1][-3000:])
    printed = [out for out, _ in outputs.values() if out.strip()]
    return json.loads(printed[0]), len(printed)


def compare_emulated(arguments: list[str], alpha_s: float, beta_s_per_byte: float) -> dict:
    """The same comparison on this machine's loopback, 2 ranks, with the course's emulated link."""
    command = [sys.executable, "-m", "dpteach.cli", "compare", "-w", "2", "--backend", "gloo",
               "--link-alpha", repr(alpha_s), "--link-beta", repr(beta_s_per_byte), *arguments, "--json"]
    out = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO,
                         env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout)
