"""The static half of "build it yourself": read the learner's code for collectives the exercise forbids.

A ring all-reduce that calls ``dist.all_reduce`` inside passes every numerical check - and teaches
nothing. So an exercise lists what it forbids (``Exercise.forbidden``: dotted names such as
``torch.distributed.all_reduce``; ``forbidden_methods``: ProcessGroup methods; ``forbidden_modules``),
and using any of them scores zero for the whole exercise, with the reason and the line. Which of torch's
functions and methods are collectives is read from torch itself (``spec.torch_collectives``), so a
collective that a new torch release adds is forbidden wherever its kind is.

This module finds uses by reading the syntax tree, before anything runs:

* every ``import`` / ``from ... import`` of a forbidden name or module;
* every dotted expression (``dist.all_reduce``, ``torch.distributed.distributed_c10d.all_reduce``,
  ``dpteach.collectives.ring.ring_all_reduce``) whose root is an imported module - resolved to the
  real object, so an alias or a re-export is caught as surely as the canonical spelling;
* every attribute named like a ProcessGroup collective (``.allreduce(``), whatever it is called on - the
  unmistakable names only (``.gather`` is also a tensor method); the run-time guard covers the rest;
* in a live notebook, bare names bound in the notebook's globals (``ar = dist.all_reduce`` in another
  cell, then ``ar(t)``) - resolved through those globals.

The learner's own function called ``all_gather`` is not ``torch.distributed.all_gather``: names are
resolved to objects, never matched as text. What reading cannot see (``getattr(dist, "all_" +
"reduce")``) is caught while the code runs, by ``guard.py``.

The same reading refuses, in every exercise, the modules that reach around the grader rather than
compute anything (:func:`reaching`: ``ctypes`` reads any object or frame through raw memory). Importing
one is tampering, not a forbidden collective: the audit hook (``tampering.py``) catches what an import
spelled otherwise then does.
"""
from __future__ import annotations

import ast
import importlib
import types
from dataclasses import dataclass

from .spec import Exercise


AMBIGUOUS_METHODS = {"broadcast", "reduce", "gather", "scatter", "reduce_scatter"}
REACHING_MODULES = ("ctypes", "_ctypes")  # raw memory: every object and frame of the grader, no audit event


@dataclass(frozen=True)
class Offense:
    """One forbidden use: what, in which cell, on which line, and how it was found."""

    name: str
    filename: str
    line: int
    how: str = "in the code"

    def __str__(self) -> str:
        return f"{self.name} ({self.filename}, line {self.line}; found {self.how})"


def resolve_dotted(dotted: str):
    """Import the longest module prefix of ``dotted`` and walk the rest as attributes; None if it fails."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except Exception:
            continue
        try:
            for attribute in parts[cut:]:
                obj = getattr(obj, attribute)
        except AttributeError:
            return None
        return obj
    return None


def _imports(tree: ast.AST) -> tuple[dict, list]:
    """Names bound by import statements -> dotted names; and (dotted name, line) for each import."""
    aliases, imported = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for item in node.names:
                if item.asname:
                    aliases[item.asname] = item.name
                else:
                    root = item.name.split(".")[0]
                    aliases[root] = root
                imported.append((item.name, node.lineno))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for item in node.names:
                dotted = f"{node.module}.{item.name}"
                aliases[item.asname or item.name] = dotted
                imported.append((dotted, node.lineno))
    return aliases, imported


def _dotted(node: ast.AST, aliases: dict, namespace: dict | None) -> str | None:
    """``a.b.c`` -> the dotted name it refers to, when its root is an import (or a module in globals)."""
    attributes = []
    while isinstance(node, ast.Attribute):
        attributes.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    if node.id in aliases:
        root = aliases[node.id]
    elif namespace is not None and isinstance(namespace.get(node.id), types.ModuleType):
        root = namespace[node.id].__name__
    else:
        return None
    return ".".join([root, *reversed(attributes)])


class Scanner:
    """Finds an exercise's forbidden names in source text."""

    def __init__(self, exercise: Exercise):
        self.exercise = exercise
        self.objects = {}
        for name in exercise.forbidden:
            obj = resolve_dotted(name)
            if obj is not None:
                self.objects[id(obj)] = (obj, name)
        self.modules = tuple(exercise.forbidden_modules)
        # Method names are matched whatever they are called on, so only the unmistakable ones: tensors
        # have .gather() and .scatter() of their own, and torch.gather is not a collective.
        self.methods = set(exercise.forbidden_methods) - AMBIGUOUS_METHODS

    def _match_object(self, obj) -> str | None:
        entry = self.objects.get(id(obj))
        if entry is not None and entry[0] is obj:
            return entry[1]
        if isinstance(obj, types.ModuleType) and self._match_module(obj.__name__):
            return obj.__name__
        return None

    def _match_module(self, dotted: str) -> str | None:
        for module in self.modules:
            if dotted == module or dotted.startswith(module + "."):
                return module
        return None

    def _match_dotted(self, dotted: str) -> str | None:
        return self._match_module(dotted) or self._match_object(resolve_dotted(dotted))

    def scan(self, files: dict, namespace: dict | None = None) -> list[Offense]:
        """Every forbidden use in ``files`` (file name -> source); unparsable files are skipped."""
        found: dict = {}
        for filename, source in files.items():
            try:
                tree = ast.parse(source)
            except SyntaxError:
                continue
            aliases, imported = _imports(tree)
            for dotted, line in imported:
                name = self._match_dotted(dotted)
                if name:
                    found.setdefault((name, filename, line), Offense(name, filename, line, "in an import"))
            for node in ast.walk(tree):
                name = None
                if isinstance(node, ast.Attribute):
                    dotted = _dotted(node, aliases, namespace)
                    name = self._match_dotted(dotted) if dotted else None
                    if name is None and node.attr in self.methods:
                        name = f"ProcessGroup.{node.attr}"
                elif isinstance(node, ast.Name) and namespace is not None and node.id not in aliases:
                    if node.id in namespace:
                        name = self._match_object(namespace[node.id])
                if name:
                    found.setdefault((name, filename, node.lineno), Offense(name, filename, node.lineno))
        return sorted(found.values(), key=lambda o: (o.filename, o.line, o.name))


def scan(exercise: Exercise, files: dict, namespace: dict | None = None) -> list[Offense]:
    """Shortcut: ``Scanner(exercise).scan(files, namespace)``."""
    return Scanner(exercise).scan(files, namespace)


def reaching(files: dict) -> list[str]:
    """Sentences for each import of a module in ``REACHING_MODULES`` in ``files`` (file name -> source)."""
    found = []
    for filename, source in files.items():
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for dotted, line in _imports(tree)[1]:
            root = dotted.split(".")[0]
            if root in REACHING_MODULES:
                found.append(f"your code imports {root} ({filename}, line {line}), which reaches into the "
                             f"grader's memory and frames")
    return found
