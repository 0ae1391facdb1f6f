"""The grader's parts that need no ranks: reading notebooks, "not attempted", the static scan, reports, build.

Everything here runs in-process in well under a second per test; the tests that start real worlds are
in test_grading_solutions.py, test_grading_variants.py and test_grading_failures.py.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dpteach.cli import main
from dpteach.grading import all_exercises, get_exercise
from dpteach.grading.forbidden import scan
from dpteach.grading.notebook import (attempted, cell_source, from_namespace, from_source, read_notebook,
                                      solution_cells, tagged_cells)
from dpteach.grading.report import CheckResult, Report
from answers.solutions import SOLUTIONS, solution

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def own_progress_file(tmp_path, monkeypatch):
    """Each test its own progress store (the session-wide throwaway file is shared between tests)."""
    monkeypatch.setenv("DPTEACH_PROGRESS", str(tmp_path / "progress.json"))
EXERCISES = ROOT / "exercises"


@pytest.mark.slow  # more than 4 s on 2 cores: in `make test`, not `make test-fast`
def test_every_exercise_has_an_up_to_date_notebook_with_the_grader_s_stub_tagged():
    result = subprocess.run([sys.executable, str(EXERCISES / "build.py"), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    ids = [e.id for e in all_exercises()]
    assert ids == sorted(ids) and {"01", "02", "03", "04", "05", "06"} <= set(ids)
    for exercise in all_exercises():
        notebook = read_notebook(EXERCISES / exercise.notebook_name)
        assert solution_cells(notebook) == [exercise.stub.rstrip()]
        assert notebook["metadata"]["dpteach"]["exercise"] == exercise.id
        assert all(not cell.get("outputs") for cell in notebook["cells"] if cell["cell_type"] == "code")
        assert f'check("{exercise.id}")' in notebook["cells"][-1]["source"]
        assert 'raise NotImplementedError("your code here")' in exercise.stub
        assert exercise.max_score > 0 and any(c.hidden for c in exercise.checks)
        assert all(1 <= c.world <= 4 for c in exercise.checks)


def _build_script():
    """``exercises/build.py``, imported as a module (it is a script beside the notebooks, not in the package)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("exercises_build", EXERCISES / "build.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look it up there
    spec.loader.exec_module(module)
    return module


def test_an_exercise_s_text_lives_in_its_notebook_and_not_in_the_grader():
    """The check modules hold what the grader needs (stub, checks, hints, rules); the intro, the try cell
    and the closing words are the notebook's own. Kept in both places, the two copies would drift apart."""
    import ast
    import dataclasses
    from dpteach.grading.spec import CHECKS_DIR, Exercise
    assert not {"intro", "try_code", "after"} & {field.name for field in dataclasses.fields(Exercise)}
    sources = {path.name: path.read_text(encoding="utf-8") for path in sorted(CHECKS_DIR.glob("*.py"))}
    for name, source in sources.items():
        assigned = {target.id for node in ast.parse(source).body if isinstance(node, ast.Assign)
                    for target in node.targets if isinstance(target, ast.Name)}
        assert not assigned & {"INTRO", "TRY", "AFTER"}, name
    build = _build_script()
    for exercise in all_exercises():
        own = build.read_own_text(exercise, EXERCISES / exercise.notebook_name)
        assert own.intro.startswith(f"# Exercise {exercise.id} ") and own.try_code.strip() and own.after.strip()
        for text in (own.intro, own.after):  # no sentence of the notebook's prose is in a check module
            for line in (line.strip() for line in text.splitlines()):
                assert len(line) < 40 or not any(line in source for source in sources.values()), (exercise.id, line)
        assert not any(own.try_code.strip() in source for source in sources.values()), exercise.id


def test_build_keeps_a_notebook_s_own_text_and_rewrites_the_stub_and_the_standard_cells(tmp_path):
    build = _build_script()
    exercise = get_exercise("03")  # its try cell calls the functions in the notebook's own process
    notebook = read_notebook(EXERCISES / exercise.notebook_name)
    cells = notebook["cells"]
    assert tagged_cells(notebook, "try") and "dpteach.launch(" not in tagged_cells(notebook, "try")[0]
    (try_cell,) = [cell for cell in cells if "try" in cell["metadata"].get("tags", [])]
    (check_text,) = [cell for cell in cells if cell_source(cell).startswith("## Check")]
    cells[0]["source"] = "# Exercise 03 - rewritten\n\nNew words, written in the notebook."
    try_cell["source"] = "import dpteach\n\nprint(dpteach.launch(lambda: 1, world_size=2))"
    check_text["source"] = cell_source(check_text).split("\n\n")[0] + "\n\n" + "edited standard text\n\nNext: 04."
    solution = [cell for cell in cells if "solution" in cell["metadata"].get("tags", [])][0]
    solution["source"] = "def assign_buckets(sizes, cap_bytes, first_cap_bytes):\n    return []"
    path = tmp_path / exercise.notebook_name
    path.write_text(json.dumps(notebook), encoding="utf-8")
    with pytest.raises(ValueError, match="standard Check text"):  # the closing words cannot be told apart
        build.read_own_text(exercise, path)
    check_text["source"] = build.CHECK_TEXT.format(id=exercise.id, stem=exercise.stem) + "\n\nNext: 04."
    path.write_text(json.dumps(notebook), encoding="utf-8")
    own = build.read_own_text(exercise, path)
    assert own == build.OwnText(intro=cells[0]["source"], try_code=try_cell["source"], after="Next: 04.")
    rebuilt = [cell_source(cell) for cell in json.loads(build.text_of(exercise, own))["cells"]]
    assert rebuilt == [cells[0]["source"], exercise.stub.rstrip(), build.TRY_TEXT, try_cell["source"],
                       cell_source(check_text), f'from dpteach.grading import check\n\ncheck("{exercise.id}")']
    cells.insert(1, {"cell_type": "markdown", "id": "extra", "metadata": {}, "source": "a cell of its own"})
    path.write_text(json.dumps(notebook), encoding="utf-8")
    with pytest.raises(ValueError, match="has 7 cells"):  # refused, rather than rewritten without that cell
        build.read_own_text(exercise, path)


def test_every_exercise_has_a_reference_solution_that_compiles():
    assert set(SOLUTIONS) == {e.id for e in all_exercises()}
    for exercise in all_exercises():
        compile(solution(exercise.id), "<solution>", "exec")


def test_get_exercise_by_id_stem_or_file_name_and_a_clear_error_otherwise():
    assert get_exercise("1").id == get_exercise("01").id == "01"
    assert get_exercise("02_ring_all_reduce.ipynb").id == "02"
    with pytest.raises(ValueError, match="not an exercise of this course; choose one of: 01"):
        get_exercise("99")


def test_untouched_stub_and_comment_only_edits_are_not_attempted():
    exercise = get_exercise("01")
    assert not attempted(exercise, from_source(exercise, exercise.stub))
    commented = exercise.stub.replace("    raise NotImplementedError", "    # thinking...\n\n    raise NotImplementedError")
    assert not attempted(exercise, from_source(exercise, commented))
    one_done = exercise.stub.replace('raise NotImplementedError("your code here")', "return tensor.clone()", 1)
    assert attempted(exercise, from_source(exercise, one_done))


def test_a_not_attempted_report_names_every_check_waiting_so_the_learner_sees_where_to_start():
    from dpteach.grading.report import not_attempted
    exercise = get_exercise("10")
    text = not_attempted(exercise).text()
    assert "not attempted" in text and f"worth {exercise.max_score} points" in text
    assert all(check.name in text for check in exercise.checks)


def test_not_attempted_from_a_live_namespace_uses_the_cell_text_or_the_marker():
    exercise = get_exercise("02")
    namespace = {"__name__": "__main__"}
    code = compile(exercise.stub, "<cell-3>", "exec")
    import linecache
    linecache.cache["<cell-3>"] = (len(exercise.stub), None, exercise.stub.splitlines(True), "<cell-3>")
    exec(code, namespace)
    assert not attempted(exercise, from_namespace(exercise, namespace))
    del linecache.cache["<cell-3>"]  # no source: the marker in the code object decides
    assert not attempted(exercise, from_namespace(exercise, namespace))
    exec("def ring_all_reduce(tensor):\n    return tensor\n", namespace)
    assert attempted(exercise, from_namespace(exercise, namespace))
    with pytest.raises(NameError, match="define ring_all_reduce first"):
        from_namespace(exercise, {})


@pytest.mark.parametrize("source, found", [
    ("import torch.distributed as dist\ndef f(t):\n    dist.all_reduce(t)\n", "torch.distributed.all_reduce"),
    ("import torch\ndef f(t):\n    torch.distributed.all_gather_into_tensor(t, t)\n",
     "torch.distributed.all_gather_into_tensor"),
    ("from torch.distributed import reduce_scatter_tensor as rs\n", "torch.distributed.reduce_scatter_tensor"),
    ("import torch.distributed.distributed_c10d as c\ndef f(t):\n    c.broadcast(t, 0)\n", "torch.distributed.broadcast"),
    ("from dpteach.collectives.ring import ring_all_reduce\n", "dpteach.collectives.ring_all_reduce"),
    ("import torch.distributed as dist\ndef f(t):\n    dist.group.WORLD.allreduce([t])\n", "ProcessGroup.allreduce"),
    ("import torch.distributed._functional_collectives as fc\n", "torch.distributed._functional_collectives"),
])
def test_static_scan_finds_built_in_collectives_however_they_are_spelled(source, found):
    offenses = scan(get_exercise("01"), {"<cell>": source})
    assert [o.name for o in offenses][:1] == [found]
    assert offenses[0].filename == "<cell>" and offenses[0].line >= 1


def test_static_scan_leaves_the_learners_own_names_and_allowed_calls_alone():
    assert scan(get_exercise("01"), {"<cell>": solution("01")}) == []
    own = "import torch.distributed as dist\ndef all_gather(chunk, n):\n    return chunk\nall_gather(1, 2)\n"
    assert scan(get_exercise("01"), {"<cell>": own}) == []
    # exercise 04 allows dist.all_reduce (it is about *when* to launch it), not dist.broadcast
    assert scan(get_exercise("04"), {"<c>": solution("04")}) == []
    assert [o.name for o in scan(get_exercise("04"), {"<c>": "import torch.distributed as d\nd.broadcast(x, 0)\n"})] \
        == ["torch.distributed.broadcast"]


def test_exercise_11_refuses_the_course_s_quantisers_and_gathered_objects_but_not_tensor_collectives():
    exercise = get_exercise("11")
    assert scan(exercise, {"<c>": solution("11")}) == []  # dist.all_gather of tensors: the point
    cell = ("import torch.distributed as dist\nfrom dpteach.sync import blockwise\nimport dpteach.sync.zeropp\n"
            "from dpteach.sync.compressed import quantize_int8\ndist.all_gather_object([None, None], 1)\n")
    assert {o.name for o in scan(exercise, {"<c>": cell})} == {
        "dpteach.sync.blockwise", "dpteach.sync.zeropp", "dpteach.sync.compressed", "torch.distributed.all_gather_object"}


def test_static_scan_resolves_names_bound_in_another_notebook_cell():
    import torch.distributed as dist
    namespace = {"dist": dist, "ar": dist.all_reduce}
    cell = "def ring_all_reduce(t):\n    ar(t)\n    dist.all_to_all_single(t, t)\n"
    names = [o.name for o in scan(get_exercise("02"), {"<cell>": cell}, namespace)]
    assert names == ["torch.distributed.all_reduce", "torch.distributed.all_to_all_single"]


def test_report_separates_visible_and_hidden_and_says_a_full_visible_score_is_not_full_marks():
    checks = [CheckResult("a", 2, False, True, "passed", earned=2),
              CheckResult("hidden: b", 3, True, False, "failed", "rank 1: the values differ", "look again")]
    report = Report("01", "T", "failed", 2, 5, checks, elapsed_s=1.0)
    text = report.text()
    assert "visible 2/2 · hidden 0/3 · total 2/5" in text and "not full marks" in text
    assert "hint: look again" in text and "hidden checks (cases not shown)" in text
    data = report.to_json()
    assert data["visible"] == {"score": 2, "max_score": 2} and data["hidden"] == {"score": 0, "max_score": 3}
    json.dumps(data)


def test_grade_command_rejects_a_bad_path_with_exit_2(tmp_path, capsys):
    assert main(["grade", str(tmp_path / "missing.ipynb")]) == 2
    assert "PATH" in capsys.readouterr().err
    assert main(["grade", "42"]) == 2
    assert "not an exercise of this course" in capsys.readouterr().err
    not_a_notebook = tmp_path / "notes.ipynb"
    not_a_notebook.write_text("{}")
    assert main(["grade", str(not_a_notebook)]) == 2
    assert "not a Jupyter notebook" in capsys.readouterr().err


def test_untouched_exercise_is_not_attempted_from_the_terminal_without_starting_ranks(capsys):
    for exercise in all_exercises():
        assert main(["grade", exercise.id, "--json"]) == 1
        report = json.loads(capsys.readouterr().out)
        assert report["status"] == "not_attempted" and report["score"] == 0
        assert report["max_score"] == exercise.max_score and len(report["checks"]) == len(exercise.checks)
    assert main(["progress", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["exercises"] == {}  # nothing attempted, nothing recorded
    assert main(["progress"]) == 0
    listed = [line.split() for line in capsys.readouterr().out.splitlines() if "not graded yet" in line]
    assert [words[0] for words in listed] == [e.stem for e in all_exercises()]  # every one, in course order
    assert all(words[-1] == f"exercises/{words[0]}.ipynb" for words in listed)


def test_every_forbidden_name_still_exists():
    """A rename elsewhere in dpteach or torch must not quietly switch a rule off."""
    from dpteach.grading.forbidden import resolve_dotted
    for exercise in all_exercises():
        assert exercise.rule and exercise.forbidden
        for name in exercise.forbidden:
            optional = name.startswith("torch.distributed._") or name.endswith("_coalesced")
            assert resolve_dotted(name) is not None or optional, (exercise.id, name)


def _raise_on_rank_one():
    import torch.distributed as dist
    if dist.get_rank() == 1:
        raise KeyError("the missing key")
    dist.barrier()


def _die_on_rank_zero():
    import os
    import torch.distributed as dist
    if dist.get_rank() == 0:
        os._exit(3)
    dist.barrier()


def test_a_try_cell_says_in_two_lines_which_rank_failed_and_why(capsys):
    import dpteach
    from dpteach.grading import explain_failures
    with explain_failures():
        dpteach.launch(_raise_on_rank_one, 2, timeout=60, show_output=False)
    assert capsys.readouterr().out.splitlines() == ["Not working yet: rank 1 raised KeyError.",
                                                    "KeyError: 'the missing key'"]
    with explain_failures():  # a rank that dies has no traceback: the message says how it ended
        dpteach.launch(_die_on_rank_zero, 2, timeout=60, show_output=False)
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("Not working yet: rank 0 exited with code 3 without returning a result")


def test_an_exercise_gives_its_hint_and_names_to_the_checks_that_give_none():
    from dpteach.grading.spec import Check, Exercise

    def run(ctx):
        return None
    own = Check("own", 1, 1, run, hint="the check's own", uses=("f",))
    bare = Check("bare", 1, 1, run, hidden=True)
    exercise = Exercise(id="99", stem="99_x", title="x", names=("f", "g"), stub="", checks=(own, bare),
                        hint="the exercise's")
    assert [(c.hint, c.uses, c.name) for c in exercise.checks] == [
        ("the check's own", ("f",), "own"), ("the exercise's", ("f", "g"), "hidden: bare")]
