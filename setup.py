"""The wheel carries the whole course: lessons, exercises and quiz bank go in as ``dpteach/_course/``.

Everything else about the package is in ``pyproject.toml``; this file only adds that copy to the build,
because setuptools' package data cannot reach folders outside the package. Which files go in is
``SHIPPED`` in ``dpteach/materials.py``, the module that finds them again at run time. An editable
install (``pip install -e .``) copies nothing: a clone reads its own folders.
"""
import importlib.util
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def course_files() -> dict:
    """``materials.shipped_files`` of this source tree (the module is loaded by path: the package itself
    is not importable while it is being built)."""
    spec = importlib.util.spec_from_file_location("_materials", HERE / "dpteach" / "materials.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.shipped_files(HERE)


class build_py_with_course(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        files = course_files()
        if not files:
            raise SystemExit("no course files found to put in the wheel: build from a clone or its sdist")
        for relative, path in files.items():
            destination = Path(self.build_lib) / "dpteach" / "_course" / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, destination)

setup(cmdclass={"build_py": build_py_with_course})
