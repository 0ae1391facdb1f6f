"""A real JupyterLab server on localhost and a real headless Chromium driving it (Playwright).

Used by the browser tests only. Chromium comes from the system (Debian's ``chromium`` package, or
``DPTEACH_CHROMIUM``): Playwright's own browser downloads are not needed.
"""
from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager

LAB_MARK = "DPTEACH_TEST_LAB_ROOT"  # set on the lab's server, inherited by its kernels: whose lab a kernel is
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage"]


# True once the open notebook's kernel is connected and idle (JupyterLab exposes its app as window.jupyterapp).
KERNEL_IDLE = """() => {
  const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  return !!k && k.connectionStatus === 'connected' && k.status === 'idle';
}"""


# Installed on the open notebook's kernel connection before Run All: a log of every message the page received
# from the kernel and of when JupyterLab began and finished handling it. JupyterLab handles the messages of a
# kernel one after another, each waiting for the last (KernelConnection._msgChain): a handler that never ends
# holds back every later message - replies and "idle" included - while the kernel itself sits idle. The log
# says which message that was, and whether the page received what the kernel sent.
RECORD_MESSAGES = """() => {
  const w = window.jupyterapp.shell.currentWidget;
  const kernel = w.sessionContext.session.kernel;
  if (kernel.__dpteachLog) return;
  const log = {events: [], open: new Map(), received: 0, handled: 0, dropped: 0, connection: []};
  kernel.__dpteachLog = log;
  window.__dpteachLog = log;
  const describe = (msg) => {
    const c = msg.content || {}, data = c.data || {};
    return {channel: msg.channel, type: msg.header.msg_type, id: msg.header.msg_id.slice(-12),
            parent: ((msg.parent_header || {}).msg_id || '').slice(-12),
            parent_type: (msg.parent_header || {}).msg_type || '',
            detail: c.execution_state || data.method || c.target_name || c.name || c.status || ''};
  };
  const note = (what, msg) => {
    log.events.push({t: Math.round(performance.now()), what, ...describe(msg)});
    if (log.events.length > 4000) { log.events.splice(0, 1000); log.dropped += 1000; }
  };
  kernel.anyMessage.connect((_, args) => {
    if (args.direction === 'recv') { log.received += 1; note('recv', args.msg); } else note('send', args.msg);
  });
  kernel.connectionStatusChanged.connect((_, status) =>
    log.connection.push({t: Math.round(performance.now()), status}));
  const handle = kernel._handleMessage.bind(kernel);
  kernel._handleMessage = async (msg) => {
    log.open.set(msg.header.msg_id, {t: Math.round(performance.now()), ...describe(msg)});
    try { return await handle(msg); }
    finally { log.open.delete(msg.header.msg_id); log.handled += 1; note('done', msg); }
  };
}"""
# What the log holds now: counts, the messages whose handling began and has not ended, and the last events.
MESSAGE_LOG = """(last) => {
  const log = window.__dpteachLog;
  if (!log) return null;
  return {received: log.received, handled: log.handled, now: Math.round(performance.now()),
          unfinished: [...log.open.values()], connection: log.connection, dropped: log.dropped,
          last: log.events.slice(-last)};
}"""


# True once the page has finished handling every message it received from the kernel.
ALL_HANDLED = """() => { const log = window.__dpteachLog;
  return !!log && log.open.size === 0 && log.handled === log.received; }"""


def message_report(page, last: int = 60) -> str:
    """The page's message log, in words: the handler that never ended (if one did not), then the last events."""
    try:
        log = page.evaluate(MESSAGE_LOG, last)
    except Exception as exc:  # noqa: BLE001 - a report on a broken page says why it has none
        return f"(no message log: {exc})"
    if log is None:
        return "(no message log was installed)"
    lines = [f"the page received {log['received']} messages from the kernel and finished handling {log['handled']}"]
    for msg in log["unfinished"]:
        lines.append(f"  STILL HANDLING since {log['now'] - msg['t']} ms: {msg['channel']} {msg['type']} "
                     f"{msg['detail']} (id {msg['id']}, parent {msg['parent_type']} {msg['parent']})")
    lines.append(f"  connection changes: {log['connection']}")
    lines.append(f"  the last {len(log['last'])} events (ms since the page opened):")
    lines += [f"    {e['t']} {e['what']:4} {e['channel'] or '-':7} {e['type']} {e['detail']} "
              f"id {e['id']} parent {e['parent_type']} {e['parent']}" for e in log["last"]]
    return "\n".join(lines)


def browser_marks(pytest) -> list:
    """The marks every browser test module carries: browser, slow, and a skip where there is no Chromium."""
    return [pytest.mark.browser, pytest.mark.slow,
            pytest.mark.skipif(chromium_path() is None,
                               reason="no Chromium found (install Debian's chromium or set DPTEACH_CHROMIUM)")]


def chromium_path() -> str | None:
    for candidate in (os.environ.get("DPTEACH_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                      shutil.which("chromium-browser")):
        if candidate and os.path.exists(candidate):
            return candidate
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def jupyterlab(root_dir: str, env: dict | None = None, timeout: float = 90.0):
    """Start ``jupyter lab`` serving ``root_dir``; yield its base URL and token; stop it afterwards."""
    port, token = _free_port(), secrets.token_hex(16)
    settings = os.path.join(root_dir, ".lab-settings", "@jupyterlab", "apputils-extension")
    os.makedirs(settings, exist_ok=True)
    with open(os.path.join(settings, "notification.jupyterlab-settings"), "w") as f:
        f.write('{"fetchNews": "false", "checkForUpdates": false}')  # no pop-up over the screenshot
    notebook_settings = os.path.join(root_dir, ".lab-settings", "@jupyterlab", "notebook-extension")
    os.makedirs(notebook_settings, exist_ok=True)
    with open(os.path.join(notebook_settings, "tracker.jupyterlab-settings"), "w") as f:
        f.write('{"windowingMode": "none"}')  # every cell in the page, not only those scrolled into view
    command = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
               f"--ServerApp.token={token}", f"--ServerApp.root_dir={root_dir}",
               "--LabApp.expose_app_in_browser=True", "--allow-root",
               f"--LabApp.user_settings_dir={os.path.join(root_dir, '.lab-settings')}",
               "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    log = open(os.path.join(root_dir, "jupyterlab.log"), "w")
    # PYTHONFAULTHANDLER: a kernel sent SIGABRT writes every thread's stack to its stderr, this log; LAB_MARK: the
    # kernels inherit it, so kernel_stacks finds this lab's kernels and no other's
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                              env={**os.environ, "PYTHONFAULTHANDLER": "1", LAB_MARK: root_dir, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"JupyterLab did not start; see {log.name}")
                time.sleep(0.5)
        yield url, token
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
        subprocess.run(["pkill", "-TERM", "-s", str(server.pid)], check=False)  # kernels it started
        log.close()


def kernel_stacks(root_dir: str, wait_s: float = 3.0) -> str:
    """Every running kernel's Python stacks, thread by thread, for a test that found one stuck: each kernel of the
    lab started in ``root_dir`` is sent SIGABRT (which ends it), and what faulthandler wrote to the log is returned."""
    import signal
    log_path = os.path.join(root_dir, "jupyterlab.log")
    before = os.path.getsize(log_path)
    found = subprocess.run(["pgrep", "-f", "ipykernel_launcher"], capture_output=True, text=True).stdout.split()
    for pid in map(int, found):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"{LAB_MARK}={root_dir}".encode() not in f.read().split(b"\0"):
                    continue  # another lab's kernel
            os.kill(pid, signal.SIGABRT)
        except OSError:
            pass
    time.sleep(wait_s)
    with open(log_path, encoding="utf-8", errors="replace") as f:
        f.seek(before)
        return f.read()[-12000:]
