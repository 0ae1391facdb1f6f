"""Run a function right after a module is first imported, without importing it (``recorder.py`` needs this:
hook torch's optimizer steps in every process that trains, import torch in none that does not).

An entry at the front of ``sys.meta_path`` is asked first about every import. For the one module
named it asks the other finders for the usual spec, and wraps the loader's ``exec_module`` so that the
function runs once the module's code has run. It then steps aside: later imports never see it.
"""
from __future__ import annotations

import sys
from importlib.abc import MetaPathFinder


class _AfterImport(MetaPathFinder):
    def __init__(self, name: str, function):
        self.name, self.function = name, function

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                run_module, function = spec.loader.exec_module, self.function

                def exec_module(module):
                    run_module(module)
                    function(module)

                spec.loader.exec_module = exec_module
                return spec
        return None


def call_after_import(name: str, function) -> None:
    """``function(module)`` once ``name`` is imported (at once, if it already is)."""
    if name in sys.modules:
        function(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, function))
