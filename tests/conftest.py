"""Shared test set-up: GPU markers skip with a reason where the hardware is absent; two "hosts" joined
by a virtual network cable for the tests that need a real network between ranks."""
import os

import pytest
import torch



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


@pytest.fixture
def two_hosts():
    """Two network namespaces joined by a veth pair: {node: (namespace, address, interface)}
    (``tests/shaped_link.py``). Needs root and iproute2's ``ip``; skips otherwise."""
    from shaped_link import CannotMakeHosts, two_hosts as make
    try:
        with make() as hosts:
            yield hosts
    except CannotMakeHosts as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def offline_site(tmp_path_factory):
    """The course's website, built once for the session: offline, strict, watched (``tests/site_build.py``)."""
    for module in ("sphinx", "myst_nb", "sphinx_book_theme"):
        pytest.importorskip(module, reason=f"{module} is not installed: pip install -e '.[site]'")
    from site_build import build_offline
    return build_offline(tmp_path_factory.mktemp("site"))
