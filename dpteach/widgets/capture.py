"""Show what a block of code prints and displays inside an ``ipywidgets.Output``, written by the kernel.

Why not ``with output:``? That form does not move any output itself: it tells the front end "route the
messages of this cell into that widget", and the front end must then send the widget's new contents back
to the kernel. JupyterLab does this over its websocket without trouble. ``jupyter execute`` and papermill
use nbclient, which sends that update on the kernel's shell channel while it waits, on the same socket,
for the cell's ``execute_reply``; jupyter_client sends through a blocking shadow of the asyncio socket, so
the asyncio layer is not told to look at the socket again, and a reply that lands during the send is only
seen when the client's poll times out. The cell has finished; the notebook sits until its timeout
(jupyter/nbclient#312 reports the same stall with other widgets). Every lesson ran its experiments inside
``with output:``, so under ``jupyter execute`` any of them could stall for minutes.

``write_into(output)`` avoids the round trip: it replaces ``sys.stdout``, ``sys.stderr`` and IPython's
display publisher for the duration of the block and writes each piece of output into ``output.outputs``
(the widget's state, as ``Output.append_stdout`` does). The kernel sends state; no client has to answer.
A progress bar that closes itself (tqdm with ``leave=False``) is dropped from the area, so no
"model not found" placeholder stays behind. Outside IPython, output goes where it always goes.
"""
from __future__ import annotations

import sys
import threading
from contextlib import contextmanager

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


class _OutputArea:
    """The outputs of one ``Output`` widget, edited in the kernel and sent as its state."""

    def __init__(self, output):
        self.output = output
        self.lock = threading.RLock()
        self.pending_clear = False

    def _edit(self, change) -> None:
        with self.lock:
            items = [] if self.pending_clear else [dict(item) for item in self.output.outputs]
            self.pending_clear = False
            change(items)
            self.output.outputs = tuple(item for item in items if _still_open(item))

    def write(self, name: str, text: str) -> None:
        def add(items):
            if items and items[-1].get("output_type") == "stream" and items[-1].get("name") == name:
                items[-1]["text"] += text  # one growing block per stream, as a front end shows it
            else:
                items.append({"output_type": "stream", "name": name, "text": text})
        if text:
            self._edit(add)

    def display(self, data: dict, metadata: dict | None, display_id: str | None, update: bool) -> None:
        item = {"output_type": "display_data", "data": dict(data), "metadata": dict(metadata or {})}
        if display_id:
            item["display_id"] = display_id

        def add(items):
            if update and display_id:
                for index, old in enumerate(items):
                    if old.get("display_id") == display_id:
                        items[index] = item
                return
            items.append(item)
        self._edit(add)

    def clear(self, wait: bool = False) -> None:
        with self.lock:
            if wait:
                self.pending_clear = True
            else:
                self.pending_clear = False
                self.output.outputs = ()


def _still_open(item: dict) -> bool:
    """False for the view of a widget that has been closed since it was shown (its model is gone)."""
    view = item.get("data", {}).get(WIDGET_VIEW)
    if not view:
        return True
    from ipywidgets.widgets import widget
    return view.get("model_id") in widget._instances


class _Stream:
    """A text stream that writes into the area (``print`` from any thread lands in order)."""

    def __init__(self, area: _OutputArea, name: str, original):
        self.area, self.name, self.original = area, name, original

    def write(self, text: str) -> int:
        self.area.write(self.name, text)
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name):  # encoding, fileno, ... as the stream it stands in for
        return getattr(self.original, name)


def _publisher_for(area: _OutputArea, shell):
    from IPython.core.displaypub import DisplayPublisher

    class PublishIntoArea(DisplayPublisher):
        def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kwargs):
            area.display(data, metadata, (transient or {}).get("display_id"), update)

        def clear_output(self, wait=False):
            area.clear(wait)

    return PublishIntoArea(shell=shell)


@contextmanager
def write_into(output, clear: bool = True):
    """Within the block, everything printed or displayed goes into ``output`` (cleared first if ``clear``)."""
    try:
        from IPython import get_ipython
        shell = get_ipython()
    except ImportError:
        shell = None
    if shell is None or not hasattr(shell, "display_pub"):
        yield
        return
    area = _OutputArea(output)
    if clear:
        area.clear()
    saved = sys.stdout, sys.stderr, shell.display_pub
    sys.stdout, sys.stderr = _Stream(area, "stdout", sys.stdout), _Stream(area, "stderr", sys.stderr)
    shell.display_pub = _publisher_for(area, shell)
    try:
        yield area
    finally:
        sys.stdout, sys.stderr, shell.display_pub = saved
        if not area.pending_clear:  # drop progress bars that closed at the very end
            area._edit(lambda items: None)
