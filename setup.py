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


def shipped_patterns() -> dict:
    spec = importlib.util.spec_from_file_location("_materials", HERE / "dpteach" / "materials.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SHIPPED


class build_py_with_course(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "dpteach" / "_course"
        copied = 0
        for folder, patterns in shipped_patterns().items():
            for pattern in patterns:
                for path in sorted((HERE / folder).glob(pattern)):
                    if path.is_file() and not path.name.startswith("."):
                        destination = target / path.relative_to(HERE)
                        destination.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(path, destination)
                        copied += 1
        if not copied:
            raise SystemExit("no course files found to put in the wheel: build from a clone or its sdist")


setup(cmdclass={"build_py": build_py_with_course})
