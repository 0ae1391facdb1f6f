"""The README's module map is true: every module of the package has a row, and none imports upwards.

The map lists the library bottom to top. Here the imports are read from the code itself - every
``import`` statement, at module level or inside a function, plus the names ``dpteach/__init__.py``
and ``dpteach/cli.py`` import on first use - and each must point at a module in the same row of the
map or in a row above it.
"""
import ast
import re
from pathlib import Path

import dpteach
import dpteach.cli

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dpteach"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(name: str) -> set[str]:
    """The package's modules that ``name`` imports, wherever the import statement stands."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found |= {f"{module}.{a.name}" if f"{module}.{a.name}" in MODULES else module for a in node.names}
    if name == "dpteach":
        found |= {f"dpteach.{m}" for m in dpteach._EXPORTS.values()}
    if name == "dpteach.cli":
        found |= {module for module, _ in dpteach.cli.COMMANDS.values()}
    return {m for m in found if m in MODULES and m != name}


def map_rows() -> list[tuple[list[str], str]]:
    """(paths in the first column, the row's text) for every row of the map, bottom of the stack first."""
    text = (ROOT / "README.md").read_text()
    table = text[text.index("<!-- module map:"):text.index("<!-- end of module map -->")]
    rows = []
    for line in table.splitlines()[3:]:  # after the marker and the header
        first, rest = line.strip("|").split("|", 1)
        rows.append((re.findall(r"`([^`]+)`", first), rest))
    return rows


def row_of(name: str, rows) -> int:
    """The row whose path is the longest prefix of the module's file."""
    rel = MODULES[name].relative_to(ROOT).as_posix()
    best = max(((len(p), i) for i, (paths, _) in enumerate(rows) for p in paths
                if rel == p or (p.endswith("/") and rel.startswith(p))), default=None)
    assert best is not None, f"{rel} has no row in the README's module map"
    return best[1]


def test_every_module_has_a_row_and_folder_rows_name_their_files():
    rows, unnamed = map_rows(), []
    for name, path in MODULES.items():
        paths, text = rows[row_of(name, rows)]
        rel = path.relative_to(ROOT).as_posix()
        if path.name == "__init__.py" or rel in paths:
            continue
        folder = next(p for p in paths if p.endswith("/") and rel.startswith(p))
        first = Path(rel[len(folder):]).parts[0]  # the file, or the sub-folder it sits in
        if Path(first).stem not in text:
            unnamed.append(f"the row for {folder} does not name {first}")
    assert not unnamed, "\n".join(unnamed)


def test_no_module_imports_a_module_listed_above_it():
    rows = map_rows()
    upward = [f"{name} (row {row_of(name, rows) + 1}) imports {dep} (row {row_of(dep, rows) + 1})"
              for name in MODULES for dep in imports_of(name) if row_of(dep, rows) > row_of(name, rows)]
    assert not upward, "\n".join(upward)


def test_the_check_sees_imports_inside_functions_too():
    # launcher imports the world at module level; doctor imports experiments inside a function
    assert "dpteach.ranks.world" in imports_of("dpteach.ranks.launcher")
    assert "dpteach.experiments.machine" in imports_of("dpteach.commands.doctor")


def test_every_package_face_lists_each_of_its_modules_in_one_line(tmp_path):
    """A package's docstring ends with its modules' first sentences, written by scripts/package_faces.py: a new
    module, or a module whose first sentence changed, makes the face stale until the script is run."""
    import shutil
    import subprocess
    import sys

    script = ROOT / "scripts" / "package_faces.py"
    check = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    copy = tmp_path / "repo"  # the same check on a copy with one module more: it must notice
    shutil.copytree(ROOT / "dpteach", copy / "dpteach", ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "scripts").mkdir()
    shutil.copy(script, copy / "scripts")
    (copy / "dpteach" / "ranks" / "newcomer.py").write_text('"""A module nobody listed yet. More text."""\n')
    stale = subprocess.run([sys.executable, str(copy / "scripts" / "package_faces.py"), "--check"],
                           capture_output=True, text=True)
    assert stale.returncode == 1 and "dpteach/ranks/__init__.py" in stale.stderr
    subprocess.run([sys.executable, str(copy / "scripts" / "package_faces.py")], check=True, capture_output=True)
    assert "* ``newcomer``: A module nobody listed yet." in (copy / "dpteach" / "ranks" / "__init__.py").read_text()
