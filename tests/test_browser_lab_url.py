"""``dpteach lab --no-browser`` on a remote machine: the learner copies the URL it prints into a browser, and the
course opens - lesson 00, not JupyterLab's Launcher. A real ``dpteach lab`` and a real Chromium follow it."""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from labsession import CHROMIUM_FLAGS, browser_marks, chromium_path

REPO = Path(__file__).resolve().parents[1]
playwright = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
pytestmark = browser_marks(pytest)


def test_the_printed_url_opens_lesson_00(tmp_path):
    course = tmp_path / "course"  # a copy: dpteach lab writes kernel metadata into the notebooks it opens
    for folder in ("notebooks", "exercises"):
        shutil.copytree(REPO / folder, course / folder)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg"),
           "DPTEACH_COURSE": str(course)}
    server = subprocess.Popen([sys.executable, "-m", "dpteach", "lab", "--no-browser", "--port", str(port),
                               "--", "--ServerApp.ip=127.0.0.1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=env, start_new_session=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(iter(server.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        deadline, url = time.monotonic() + 90, None
        while url is None and time.monotonic() < deadline and server.poll() is None:
            url = next((m.group(0) for line in list(lines) for m in [re.search(r"http://\S+token=\w+", line)] if m), None)
            time.sleep(0.3)
        assert url is not None, "dpteach lab printed no URL:\n" + "".join(lines)[-3000:]
        assert "/lab/tree/notebooks/00_start_here.ipynb" in url, url
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            try:
                page.goto(url)
                page.wait_for_selector(".jp-Notebook", timeout=90_000)
                tabs = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab .lm-TabBar-tabLabel")
                current = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel")
                page.wait_for_function("() => document.querySelector("
                                       "'.lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel')",
                                       timeout=30_000)
                assert current.inner_text() == "00_start_here.ipynb"
                assert tabs.all_inner_texts() == ["00_start_here.ipynb"]  # the only tab: no Launcher beside it
                assert page.locator(".jp-Launcher").count() == 0  # the first screen is the course
            finally:
                browser.close()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
