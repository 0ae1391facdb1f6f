"""Shared test set-up: GPU markers skip with a reason where the hardware is absent; two "hosts" joined
by a virtual network cable for the tests that need a real network between ranks."""
import os
import shutil
import subprocess
import uuid

import pytest
import torch

NODES = (("a", "10.77.0.1"), ("b", "10.77.0.2"))


def pytest_collection_modifyitems(config, items):
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for item in items:
        if "gpu" in item.keywords and gpus < 1:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU; this machine has none"))
        if "multigpu" in item.keywords and gpus < 2:
            item.add_marker(pytest.mark.skip(reason=f"multi-rank NCCL needs 2+ GPUs; this machine has {gpus}"))


@pytest.fixture
def ipython_shell():
    """An IPython shell for the test, as a notebook's kernel has one; removed afterwards. A shell left behind
    changes every later test in the process: ``get_ipython()`` then finds it, and a panel run outside any
    notebook writes into its widget instead of printing (``dpteach/widgets/capture.py``)."""
    from IPython.core.interactiveshell import InteractiveShell
    had = InteractiveShell.initialized()
    shell = InteractiveShell.instance()
    yield shell
    if not had:
        InteractiveShell.clear_instance()


@pytest.fixture(autouse=True)
def _private_progress_store(tmp_path, monkeypatch):
    """Never write a learner's real progress file from the tests."""
    if "DPTEACH_PROGRESS" not in os.environ:
        monkeypatch.setenv("DPTEACH_PROGRESS", str(tmp_path / "progress.json"))


def _ip(*args, netns=None):
    prefix = ["ip", "netns", "exec", netns] if netns else []
    subprocess.run([*prefix, "ip", *args], check=True, capture_output=True, text=True, timeout=30)


@pytest.fixture
def two_hosts():
    """Two network namespaces joined by a veth pair: {node: (namespace, address, interface)}.

    Each node is a Linux network namespace with its own address, so ranks placed in them can reach each
    other only over that cable, as two machines would. Needs root and iproute2's ``ip``; skips otherwise.
    """
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
