"""The grade, as a table for people and as JSON for tools.

Two things the report is careful about:

* **Visible and hidden checks are totalled apart.** A learner who sees every visible check pass and
  a total below the maximum must understand why at a glance, so the last lines read
  ``visible 12/12 · hidden 5/8 · total 17/20``. Hidden checks are listed (by a vague name) with their
  outcome and a message that says which property failed, never the case or the expected values.
* **A forbidden call zeroes the exercise and says so first**, with the line where it was found: the
  checks may all pass (the built-in collective is correct, after all), and the table still shows that,
  but the score is 0 and the reason is the first thing printed.

JSON (``dpteach grade --json``)::

    {"exercise": "01", "title": ..., "status": "passed" | "failed" | "not_attempted" | "error",
     "score": 17, "max_score": 20, "visible": {"score", "max_score"}, "hidden": {"score", "max_score"},
     "forbidden": ["torch.distributed.all_reduce (cell 1, line 9; found ...)"],
     "tampered": ["your code replaced torch.equal, which the checks use to judge it"], "error": null | "...",
     "elapsed_s": 8.1,
     "checks": [{"name", "passed", "points", "earned", "hidden", "outcome", "message", "hint"}]}

``points`` is what a check is worth, ``earned`` what it gave (0 when the exercise is zeroed); ``outcome``
is one of passed, failed, error (the learner's code raised), timed_out, not_run, forbidden, tampered (the
learner's code changed how the checks judge - replaced their tools, left torch dispatching through a mode,
reached into their frames (``seal.py``, ``tampering.py``), or passed a check that fails when judged again
outside the ranks (``judge.py``); the exercise then scores 0), grader_error (the grader failed; not a pass).
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass, field

OUTCOME_LABEL = {"passed": "  ok", "failed": "FAIL", "error": " ERR", "timed_out": "TIME",
                 "not_run": "SKIP", "forbidden": "FORB", "grader_error": "BUG!", "tampered": "TAMP"}


@dataclass
class CheckResult:
    name: str
    points: int
    hidden: bool
    passed: bool = False
    outcome: str = "not_run"
    message: str = ""
    hint: str = ""
    earned: int = 0


@dataclass
class Report:
    exercise: str
    title: str
    status: str
    score: int
    max_score: int
    checks: list = field(default_factory=list)
    forbidden: list = field(default_factory=list)
    tampered: list = field(default_factory=list)  # what the learner's code did to the checks' tools
    error: str | None = None
    elapsed_s: float = 0.0
    rule: str = ""

    def part(self, hidden: bool) -> dict:
        rows = [c for c in self.checks if c.hidden == hidden]
        return {"score": sum(c.earned for c in rows), "max_score": sum(c.points for c in rows)}

    def to_json(self) -> dict:
        return {"exercise": self.exercise, "title": self.title, "status": self.status, "score": self.score,
                "max_score": self.max_score, "visible": self.part(False), "hidden": self.part(True),
                "forbidden": list(self.forbidden), "tampered": list(self.tampered), "error": self.error, "elapsed_s": round(self.elapsed_s, 2),
                "checks": [{"name": c.name, "passed": c.passed, "points": c.points, "earned": c.earned,
                            "hidden": c.hidden, "outcome": c.outcome, "message": c.message, "hint": c.hint}
                           for c in self.checks]}

    def text(self) -> str:
        """The table printed by ``check()`` and ``dpteach grade``."""
        out = [f"Exercise {self.exercise}: {self.title}"]
        if self.status == "not_attempted":
            out.append("  not attempted: the stub is untouched. Write your code in the cell tagged "
                       "'solution' (it raises NotImplementedError), run it, then check again.")
            out.append(f"  The {len(self.checks)} checks waiting, worth {self.max_score} points:")
            out += [f"       -/{c.points:<2} {c.name}" + ("  (hidden cases)" if c.hidden else "") for c in self.checks]
            return "\n".join(out)
        if self.error:
            out.append("  your code could not be graded:")
            out.append(textwrap.indent(self.error, "    "))
            out.append(f"  (none of the {len(self.checks)} checks, worth {self.max_score} points, could run)")
            return "\n".join(out)
        if self.tampered:
            out.append("  SCORE 0: the checks could not be trusted - the code under test changed the libraries "
                       "they judge with:")
            out += [f"    - {line}" for line in self.tampered]
        if self.forbidden:
            out.append(f"  SCORE 0: {self.rule}".rstrip())
            out += [f"    - uses {offense}" for offense in self.forbidden]
        hints_shown = set()
        for hidden in (False, True):
            rows = [c for c in self.checks if c.hidden == hidden]
            if not rows:
                continue
            out.append("")
            out.append("  hidden checks (cases not shown):" if hidden else "  visible checks:")
            for c in rows:
                out.append(f"  {OUTCOME_LABEL.get(c.outcome, c.outcome):>4} {c.earned:>2}/{c.points:<2} {c.name}")
                if c.outcome != "passed" and c.message:
                    out.append(textwrap.indent(c.message, " " * 12))
                if c.outcome in ("failed", "error", "timed_out") and c.hint and c.hint not in hints_shown:
                    hints_shown.add(c.hint)  # once is enough; the same hint under every row is noise
                    out.append(textwrap.indent(textwrap.fill("hint: " + c.hint, 88), " " * 12))
        visible, hidden_part = self.part(False), self.part(True)
        out.append("")
        out.append(f"  visible {visible['score']}/{visible['max_score']} · hidden {hidden_part['score']}/"
                   f"{hidden_part['max_score']} · total {self.score}/{self.max_score}  -> {self.status}"
                   f"  ({self.elapsed_s:.1f} s)")
        if self.status != "passed" and visible["score"] == visible["max_score"] and visible["max_score"]:
            out.append("  every visible check passes, but that is not full marks: the hidden checks above "
                       "try other world sizes, lengths and dtypes.")
        return "\n".join(out)

    def __str__(self) -> str:
        return self.text()


def not_attempted(exercise) -> Report:
    checks = [CheckResult(c.name, c.points, c.hidden, message="not attempted") for c in exercise.checks]
    return Report(exercise.id, exercise.title, "not_attempted", 0, exercise.max_score, checks, rule=exercise.rule)

