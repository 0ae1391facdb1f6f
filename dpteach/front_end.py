"""Does the front end draw widgets? If not, a panel leaves its results as plain outputs of the cell.

A panel's controls and results live in ipywidgets (``dpteach/widgets/panel.py``), a quiz's questions too
(``dpteach/quiz/widget.py``). A front end without a widget manager - a
notebook run by ``jupyter execute``, papermill or nbconvert, a read-only viewer of the stored notebook, Colab
before its custom widget manager is on - shows a widget as one line of text, ``VBox(children=...)``, and nothing
of the figures and tables inside it. So where the front end cannot draw widgets, a panel shows its controls'
values as text and, after each run, writes the run's figures, tables and notes into the cell itself, where every
front end shows them and every stored copy keeps them.

A kernel cannot ask its front end whether it draws widgets (a widget manager answers only when it is loaded,
and only after the cell that needed the answer). So the choice is made from what can be known:

* ``DPTEACH_WIDGETS=on`` or ``off`` in the kernel's environment (or :func:`use`) decides outright;
* a kernel started by a Jupyter server for a notebook (JupyterLab, Notebook 7, JupyterHub) has
  ``JPY_SESSION_NAME`` set (``jupyter_server/services/sessions/sessionmanager.py``): those front ends carry the
  widget manager that ``pip install ipywidgets`` brings, so widgets are drawn;
* Colab (``COLAB_RELEASE_TAG``) draws ipywidgets 8 once its custom widget manager is enabled: it is enabled here;
* VS Code's notebooks draw widgets (``VSCODE_PID`` in the kernel's environment);
* any other kernel - one that nbclient, papermill, nbval or another client started - gets plain outputs.

Outside a kernel (a script, the test suite's own processes) nothing is displayed, and panels keep widgets.
"""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager

SETTING = "DPTEACH_WIDGETS"
CHOICES = ("auto", "on", "off")
_chosen: str | None = None  # what use() set in this process; None: the environment decides
_colab_ready = False


def use(mode: str) -> None:
    """``"on"``: draw widgets; ``"off"``: plain outputs; ``"auto"``: decide as the module docstring says."""
    global _chosen
    _chosen = _checked("mode", mode)


def _checked(argument: str, value) -> str:
    text = str(value).strip().lower()
    if text not in CHOICES:
        raise ValueError(f"{argument}={value!r} is not allowed: it must be one of {', '.join(CHOICES)} "
                         f"('off': panels write their figures and tables into the cell as plain outputs)")
    return text


@contextmanager
def widgets_only():
    """Inside the block panels behave as if widgets were drawn: runs that only feed their widgets (the suite's run
    of every option of every panel, ``dpteach/widgets/options.py``) do not write their results into the cell as well."""
    global _chosen
    saved, _chosen = _chosen, "on"
    try:
        yield
    finally:
        _chosen = saved


def in_kernel() -> bool:
    """True inside a Jupyter kernel (where a front end shows HTML, images and perhaps widgets), False in a terminal,
    a plain script or a rank. Read from ``sys.modules``: a process that never imported IPython is no kernel, and
    asking must not import it."""
    get_ipython = getattr(sys.modules.get("IPython"), "get_ipython", None)
    shell = get_ipython() if get_ipython else None
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def _enable_colab_widgets() -> bool:
    """Colab's custom widget manager, which ipywidgets 8 needs there; False where it cannot be enabled."""
    global _colab_ready
    if not _colab_ready:
        try:
            from google.colab import output  # noqa: F401  (only inside Colab)
            output.enable_custom_widget_manager()
            _colab_ready = True
        except Exception:
            return False
    return True


def widgets_drawn() -> bool:
    """Whether this kernel's front end draws the panels' widgets (see the module docstring for the rule)."""
    mode = _chosen or _checked(SETTING, os.environ.get(SETTING, "auto") or "auto")
    if mode != "auto":
        return mode == "on"
    if not in_kernel():
        return True
    if os.environ.get("JPY_SESSION_NAME") or os.environ.get("VSCODE_PID"):
        return True
    if os.environ.get("COLAB_RELEASE_TAG") or "google.colab" in sys.modules:
        return _enable_colab_widgets()
    return False


def why() -> str:
    """One line for a plain panel: why it is plain, and how to change that."""
    return (f"this front end draws no widgets, so the panel's results are written here as plain outputs; to change "
            f"a value, call the panel's run(name=value); with a front end that does draw widgets, set {SETTING}=on")
