"""Write, at the end of each package's docstring (its face, ``__init__.py``), one line for each of its modules and
sub-packages: the first sentence of that module's own docstring.

    python scripts/package_faces.py          # rewrite the faces that are out of date
    python scripts/package_faces.py --check  # exit 1 and name them, changing nothing (the test runs this)

A face keeps its own prose above the list; the list starts at ``MARKER`` and runs to the docstring's end, so
that a new module shows on its package's face without anyone copying a line by hand.
"""
from __future__ import annotations

import argparse
import ast
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dpteach"
MARKER = "Its modules, one line each (``scripts/package_faces.py`` writes this list from their docstrings):"
WIDTH = 116


def first_sentence(path: Path) -> str:
    """The first sentence of a module's (or a package's) docstring, on one line."""
    source = path / "__init__.py" if path.is_dir() else path
    doc = ast.get_docstring(ast.parse(source.read_text(encoding="utf-8"))) or ""
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    if ". " in paragraph:
        return paragraph.split(". ", 1)[0] + "."
    return paragraph or "(no docstring)"


def members(package: Path) -> list[tuple[str, Path]]:
    modules = [(p.stem, p) for p in sorted(package.glob("*.py")) if p.name != "__init__.py"]
    subpackages = [(p.name + "/", p) for p in sorted(package.iterdir()) if (p / "__init__.py").is_file()]
    return modules + subpackages


def listing(package: Path) -> str:
    lines = [MARKER, ""]
    for name, path in members(package):
        lines += textwrap.wrap(f"* ``{name}``: {first_sentence(path)}", WIDTH, subsequent_indent="  ",
                               break_long_words=False, break_on_hyphens=False)
    return "\n".join(lines)


def rewritten(init: Path) -> str:
    """``init``'s text with its docstring's list brought up to date."""
    text = init.read_text(encoding="utf-8")
    tree = ast.parse(text)
    node = tree.body[0] if tree.body and isinstance(tree.body[0], ast.Expr) else None
    if node is None or not isinstance(node.value, ast.Constant) or not isinstance(node.value.value, str):
        raise SystemExit(f"{init.relative_to(ROOT)}: a package face starts with a docstring; this one has none")
    lines = text.splitlines(keepends=True)
    start = sum(len(line) for line in lines[:node.lineno - 1]) + node.col_offset
    end = sum(len(line) for line in lines[:node.end_lineno - 1]) + node.end_col_offset
    literal = text[start:end]
    if not (literal.startswith('"""') and literal.endswith('"""')):
        raise SystemExit(f"{init.relative_to(ROOT)}: its docstring must use triple double quotes")
    body = literal[3:-3]
    if MARKER in body:
        body = body[:body.index(MARKER)]
    body = body.rstrip() + "\n\n" + listing(init.parent) + "\n"
    return text[:start] + '"""' + body + '"""' + text[end:]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a face is out of date")
    args = parser.parse_args(argv)
    stale = []
    for init in sorted(PACKAGE.rglob("__init__.py")):
        new = rewritten(init)
        if new != init.read_text(encoding="utf-8"):
            stale.append(init.relative_to(ROOT).as_posix())
            if not args.check:
                init.write_text(new, encoding="utf-8")
    if args.check and stale:
        print("out of date (run python scripts/package_faces.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    print(("rewrote: " + ", ".join(stale)) if stale else "every package face is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
