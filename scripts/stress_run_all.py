"""Run All of the heaviest lessons, again and again, in a real JupyterLab in headless Chromium, to catch a
Run All that never ends - and, when one does not, keep everything that says where it stopped.

Not a test: a harness for a rare fault (one Run All in many, and only under the suite's conditions). Usage::

    python scripts/stress_run_all.py                       # lessons 16, 13, 14; 17 rounds; a CPU hog beside
    python scripts/stress_run_all.py --lessons 16 --rounds 50 --out stress-output

The conditions of the suite, reproduced: the lessons run one after another in one lab, each in a page of
its own, with every kernel shut down after each (as ``tests/test_browser_notebooks.py`` runs them); before
each round other kernels, zygotes and a lab are started and stopped (``churn``); one process spins on a
core the whole time (``--no-hog`` to leave it out).

Three vantage points are recorded on every run, so that a lost message can be placed:

* the page: every message the notebook's kernel connection received and when JupyterLab began and finished
  handling it (``labsession.RECORD_MESSAGES``);
* the kernel: every message it read and sent, with times (an IPython start-up file, ``KERNEL_TRACE``);
* the server: the lab's whole log.

When a Run All does not finish within ``--timeout`` seconds, ``OUT/freeze-N/`` receives: the page's message
report and a screenshot; every thread's stack of the kernel and of each process under it (the zygotes and
their ranks), taken with py-spy without stopping them where py-spy is installed, then the kernel's own
faulthandler dump; the process tree with each process's state and wait channel; the kernel's message trace;
the lab's log. ``OUT/summary.json`` counts the runs and freezes, with each run's time.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from labsession import (CHROMIUM_FLAGS, KERNEL_IDLE, RECORD_MESSAGES, chromium_path, jupyterlab,  # noqa: E402
                        kernel_stacks, message_report)

RUN_ALL = "() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }"
ALL_RAN = """() => { const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')];
  return prompts.length > 0 && prompts.every(p => /\\[\\d+\\]/.test(p.innerText)); }"""
WAITING = """() => [...document.querySelectorAll('.jp-CodeCell')].map((c, i) => [i, c]).filter(([i, c]) => {
  const p = c.querySelector('.jp-InputPrompt'); return !p || !/\\[\\d+\\]/.test(p.innerText); })
  .map(([i, c]) => `cell ${i} ${(c.querySelector('.jp-InputPrompt') || {}).innerText || ''}`)"""

# Run in every kernel at start-up (IPython's profile start-up folder): a line per message the kernel reads
# (Session.deserialize) and sends (Session.send), to DPTEACH_KERNEL_TRACE/kernel-<pid>.log.
KERNEL_TRACE = textwrap.dedent('''
    import os, threading, time
    def _dpteach_trace():
        from IPython import get_ipython
        shell = get_ipython()
        kernel = getattr(shell, "kernel", None)
        folder = os.environ.get("DPTEACH_KERNEL_TRACE")
        if kernel is None or not folder:
            return
        log = open(os.path.join(folder, f"kernel-{os.getpid()}.log"), "a", buffering=1)
        lock = threading.Lock()
        session = kernel.session
        def channel(stream):
            for name in ("shell_stream", "control_stream", "iopub_socket", "stdin_socket"):
                if stream is getattr(kernel, name, None):
                    return name.split("_")[0]
            return type(stream).__name__
        def line(direction, where, msg):
            header, parent = msg.get("header", {}), msg.get("parent_header", {}) or {}
            content = msg.get("content", {}) or {}
            data = content.get("data", {}) if isinstance(content.get("data"), dict) else {}
            detail = content.get("execution_state") or data.get("method") or content.get("target_name") or ""
            with lock:
                log.write(f"{time.time():.3f} {threading.current_thread().name} {direction} {where} "
                          f"{header.get('msg_type')} {detail} id {header.get('msg_id')} "
                          f"parent {parent.get('msg_type', '')} {parent.get('msg_id', '')}\\n")
        send, deserialize = session.send, session.deserialize
        def traced_send(stream, msg_or_type, *args, **kwargs):
            msg = send(stream, msg_or_type, *args, **kwargs)
            if isinstance(msg, dict):
                line("sent", channel(stream), msg)
            return msg
        def traced_deserialize(*args, **kwargs):
            msg = deserialize(*args, **kwargs)
            line("read", "-", msg)
            return msg
        session.send, session.deserialize = traced_send, traced_deserialize
    _dpteach_trace()
    del _dpteach_trace
''')

CHURN = textwrap.dedent('''
    from dpteach import launch
    def body():
        import torch, torch.distributed as dist
        t = torch.ones(1000) * dist.get_rank()
        dist.all_reduce(t)
        return float(t[0])
    print(launch(body, 2))
''')


def churn(folder: Path) -> None:
    """Start and stop what the suite starts before a lesson: a lab of its own, and a kernel (under nbclient)
    that forks a zygote and a world of two ranks from it."""
    import nbformat
    from nbclient import NotebookClient
    lab = folder / "churn-lab"
    lab.mkdir(exist_ok=True)
    with jupyterlab(str(lab)) as (url, token):
        urllib.request.urlopen(f"{url}/api/kernelspecs?token={token}", timeout=10).close()
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(CHURN)])
    NotebookClient(notebook, timeout=300, kernel_name="python3").execute()


def shut_down_kernels(url: str, token: str) -> None:
    with urllib.request.urlopen(f"{url}/api/kernels?token={token}", timeout=10) as reply:
        kernels = json.load(reply)
    for kernel in kernels:
        request = urllib.request.Request(f"{url}/api/kernels/{kernel['id']}?token={token}", method="DELETE")
        urllib.request.urlopen(request, timeout=30).close()


def process_tree(root: int) -> list[int]:
    """``root`` and every process under it."""
    found, frontier = [root], [root]
    while frontier:
        children = []
        for pid in frontier:
            try:
                with open(f"/proc/{pid}/task/{pid}/children") as f:
                    children += [int(c) for c in f.read().split()]
            except OSError:
                pass
        found += children
        frontier = children
    return found


def kernel_pids(lab_folder: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", "ipykernel_launcher"], capture_output=True, text=True).stdout.split()
    mine = []
    for pid in map(int, out):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"DPTEACH_TEST_LAB_ROOT={lab_folder}".encode() in f.read().split(b"\0"):
                    mine.append(pid)
        except OSError:
            pass
    return mine


def keep_freeze(page, where: Path, lab_folder: str, trace_folder: Path) -> None:
    """Everything that can say where a Run All stopped, into ``where``."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "page_messages.txt").write_text(message_report(page, last=400))
    (where / "waiting_cells.json").write_text(json.dumps(page.evaluate(WAITING), indent=1))
    page.screenshot(path=str(where / "page.png"))
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    for kernel in kernel_pids(lab_folder):
        tree = process_tree(kernel)
        ps = subprocess.run(["ps", "-o", "pid,ppid,stat,wchan:32,etime,time,args", "-p", ",".join(map(str, tree))],
                            capture_output=True, text=True).stdout
        (where / f"processes-{kernel}.txt").write_text(ps)
        if os.path.exists(spy):
            dumps = []
            for pid in tree:
                done = subprocess.run([spy, "dump", "--locals", "--pid", str(pid)], capture_output=True, text=True,
                                      timeout=60)
                dumps.append(f"=== {pid}\n{done.stdout}{done.stderr}")
            (where / f"stacks-{kernel}.txt").write_text("\n".join(dumps))
        trace = trace_folder / f"kernel-{kernel}.log"
        if trace.exists():
            shutil.copy(trace, where / trace.name)
    (where / "faulthandler.txt").write_text(kernel_stacks(lab_folder))  # ends the kernels: last
    shutil.copy(Path(lab_folder) / "jupyterlab.log", where / "jupyterlab.log")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lessons", default="16,13,14", help="lesson numbers, in the order each round runs them")
    parser.add_argument("--rounds", type=int, default=17)
    parser.add_argument("--timeout", type=float, default=200.0, help="seconds a Run All may take (the test's limit)")
    parser.add_argument("--out", default="stress-output")
    parser.add_argument("--no-hog", action="store_true", help="leave out the process spinning on a core")
    parser.add_argument("--no-churn", action="store_true", help="leave out the labs and kernels between rounds")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, not {args.rounds}")
    numbers = [n.strip().zfill(2) for n in args.lessons.split(",") if n.strip()]
    lessons = []
    for number in numbers:
        found = sorted((REPO / "notebooks").glob(f"{number}_*.ipynb"))
        if not found:
            parser.error(f"--lessons: no lesson numbered {number} in notebooks/")
        lessons.append(found[0])
    if chromium_path() is None:
        parser.error("no Chromium found (install Debian's chromium or set DPTEACH_CHROMIUM)")
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    lab_folder, trace_folder, ipython_dir = out / "lab", out / "kernel-trace", out / "ipython"
    for folder in (lab_folder, trace_folder, ipython_dir / "profile_default" / "startup"):
        folder.mkdir(parents=True, exist_ok=True)
    (ipython_dir / "profile_default" / "startup" / "00-dpteach-trace.py").write_text(KERNEL_TRACE)
    for lesson in lessons:
        shutil.copy(lesson, lab_folder / lesson.name)
    env = {"DPTEACH_PROGRESS": str(out / "progress.json"), "IPYTHONDIR": str(ipython_dir),
           "DPTEACH_KERNEL_TRACE": str(trace_folder), "DPTEACH_GPUS": "0", "CUDA_VISIBLE_DEVICES": ""}
    summary = {"lessons": [p.name for p in lessons], "rounds": args.rounds, "hog": not args.no_hog,
               "churn": not args.no_churn, "timeout_s": args.timeout, "runs": [], "freezes": 0,
               "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    hog = None if args.no_hog else subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with jupyterlab(str(lab_folder), env=env) as (url, token), sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
            for round_number in range(args.rounds):
                if not args.no_churn:
                    churn(out)
                for lesson in lessons:
                    page = browser.new_page(viewport={"width": 1400, "height": 1000})
                    run = {"round": round_number, "lesson": lesson.name}
                    try:
                        page.goto(f"{url}/lab/workspaces/{lesson.stem}/tree/{lesson.name}?token={token}&reset")
                        page.wait_for_selector(".jp-Notebook .jp-CodeCell", timeout=90_000)
                        page.wait_for_function(KERNEL_IDLE, timeout=90_000)
                        page.evaluate(RECORD_MESSAGES)
                        start = time.monotonic()
                        page.evaluate(RUN_ALL)
                        try:
                            page.wait_for_function(ALL_RAN, timeout=args.timeout * 1000)
                            run["run_all_s"] = round(time.monotonic() - start, 1)
                            run["froze"] = False
                        except PlaywrightTimeout:
                            summary["freezes"] += 1
                            run["froze"] = True
                            run["kept"] = f"freeze-{summary['freezes']}"
                            keep_freeze(page, out / run["kept"], str(lab_folder), trace_folder)
                    finally:
                        page.close()
                        shut_down_kernels(url, token)
                    summary["runs"].append(run)
                    times = [r["run_all_s"] for r in summary["runs"] if "run_all_s" in r]
                    print(f"round {round_number + 1}/{args.rounds} {lesson.name}: "
                          f"{'FROZE (kept in ' + run['kept'] + ')' if run['froze'] else str(run['run_all_s']) + ' s'}"
                          f"  [{len(summary['runs'])} runs, {summary['freezes']} freezes]", flush=True)
                    summary["median_run_all_s"] = statistics.median(times) if times else None
                    (out / "summary.json").write_text(json.dumps(summary, indent=1))
                    for log in trace_folder.glob("kernel-*.log"):  # a finished run's trace is not needed
                        if not run["froze"]:
                            log.unlink()
            browser.close()
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
        summary["ended"] = time.strftime("%Y-%m-%d %H:%M:%S")
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"{len(summary['runs'])} Run Alls, {summary['freezes']} froze; {out / 'summary.json'}")
    return 1 if summary["freezes"] else 0


if __name__ == "__main__":
    sys.exit(main())
