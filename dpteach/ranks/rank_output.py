"""What the caller of ``launch`` sees while its ranks run: their output, line by line, and progress bars.

Each rank's stdout and stderr arrive on one pipe, read by a thread of the launcher (``read``); the
launcher's poll loop drains them (``drain``) into the cell or terminal, each line prefixed with its
rank, and keeps each rank's last lines for the report of a rank that dies without a traceback.

Progress has two phases (``update``): "starting N ranks" - the ranks that have joined the world, which
takes a second or two on a laptop at the first launch (torch imported once, ``zygote.py``) or on GPUs
(each rank a fresh interpreter importing torch), a fraction of a second otherwise - then the run's own progress,
when rank 0 reports some (``dpteach.report_progress``); both are read from the launch's store.
"""
from __future__ import annotations

import io
import queue
from collections import deque

from ..front_end import in_kernel, widgets_drawn


class RankOutput:
    LAST_LINES = 20  # kept per rank, for the report of a rank that dies without a traceback

    def __init__(self, world_size: int, show_output: bool, progress: bool):
        self.world_size, self.show_output, self.want_progress = world_size, show_output, progress
        self.last_lines = [deque(maxlen=self.LAST_LINES) for _ in range(world_size)]
        self.lines: queue.Queue = queue.Queue()
        self.bar = None
        self.phase = None  # None -> "starting" -> "joined" -> "run"

    def read(self, rank: int, stream) -> None:
        """A reader thread's loop: every line of ``rank``'s pipe, until the rank closes it."""
        for raw in iter(stream.readline, b""):
            self.lines.put((rank, raw.decode("utf-8", "replace").rstrip("\n")))
        stream.close()

    def drain(self) -> None:
        while True:
            try:
                rank, line = self.lines.get_nowait()
            except queue.Empty:
                return
            self.last_lines[rank].append(line)
            if self.show_output:
                if self.bar is not None:
                    self.bar.write(f"[rank {rank}] {line}")
                else:
                    print(f"[rank {rank}] {line}", flush=True)

    def update(self, store) -> None:
        if not self.want_progress or store is None:
            return
        if self.phase is None:
            self.bar = progress_bar(total=self.world_size, desc=f"starting {self.world_size} ranks", unit="rank")
            self.phase = "starting"
        if self.phase == "starting":
            joined = min(store.add("launch/joined", 0), self.world_size)
            _advance(self.bar, joined)
            if joined == self.world_size:
                self.bar.refresh()  # show "N/N" before it goes: ranks forked in milliseconds join between two draws
                self.bar.close()
                self.bar, self.phase = None, "joined"
        if self.phase != "run" and store.check(["progress/total"]):
            if self.bar is not None:  # the run reports progress, so every rank has joined (not all counted yet)
                _advance(self.bar, self.bar.total)
                self.bar.refresh()
                self.bar.close()
            desc = store.get("progress/desc").decode() if store.check(["progress/desc"]) else None
            self.bar = progress_bar(total=int(store.get("progress/total")), desc=desc)
            self.phase = "run"
        if self.phase == "run":
            if store.check(["progress/desc"]):  # a run may rename its bar as it goes ("batch 64, lr 0.02")
                desc = store.get("progress/desc").decode()
                if desc != (self.bar.desc or "").rstrip(": "):
                    self.bar.set_description(desc)
            _advance(self.bar, store.add("progress/done", 0))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def progress_bar(iterable=None, **options):
    """A progress bar that disappears when it completes: a widget inside a Jupyter kernel, text on stderr
    anywhere else, none shown in a kernel whose front end draws no widgets (its stored outputs keep results, not a
    bar). Decided here rather than by ``tqdm.auto``, which draws a widget (printed as text on stdout) in any process
    that has imported ``ipykernel.zmqshell``, kernel or not."""
    from tqdm import tqdm
    if not in_kernel():
        return tqdm(iterable, leave=False, **options)
    if not widgets_drawn():  # dpteach/front_end.py
        return tqdm(iterable, leave=False, file=io.StringIO(), **options)
    from tqdm.notebook import tqdm as widget_bar
    return widget_bar(iterable, leave=False, **options)


def _advance(bar, to: int) -> None:
    if to != bar.n:
        bar.update(to - bar.n)
