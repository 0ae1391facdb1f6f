"""Python imports ``sitecustomize`` at start-up from the first folder on its path that has one. ``dpteach
profile`` puts this folder first on the profiled command's ``PYTHONPATH``, so each Python process the
command starts (torchrun's workers included) hooks its optimizer steps (``dpteach.profiling.recorder``)
and then runs the ``sitecustomize`` it would have run without us, if there is one."""
import importlib.machinery
import importlib.util
import os
import sys


def _run_the_usual_sitecustomize():
    here = os.path.dirname(os.path.abspath(__file__))
    others = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


try:
    from dpteach.profiling.recorder import install_from_environment
    install_from_environment()
except Exception as exc:  # never stop the learner's job for want of a trace
    print(f"dpteach profile: could not hook this process ({type(exc).__name__}: {exc}); it is not recorded",
          file=sys.stderr)
_run_the_usual_sitecustomize()
