"""The notebook panel driven from Python: choose, submit, feedback, refusal, score, progress."""
from html import escape

import pytest

from dpteach.progress import ProgressStore
from dpteach.quiz import QuizPanel, load_bank, show


@pytest.fixture
def store_path(tmp_path, monkeypatch):
    path = tmp_path / "progress.json"
    monkeypatch.setenv("DPTEACH_PROGRESS", str(path))
    return path


def _wrong(item):
    return next(option.text for option in item.options if not option.correct)


def test_single_item_submit_shows_every_explanation_and_records(store_path):
    panel = show("scaling", seed=2)
    assert isinstance(panel, QuizPanel) and len(panel.items) == len(load_bank().topic("scaling"))
    view = panel.items[0]
    view.choose([_wrong(view.item)])
    result = view.submit()
    assert result["correct"] is False and result["chosen"] == [_wrong(view.item)]
    html = view.feedback.value
    for option in view.item.options:
        assert escape(option.text) in html and escape(option.explanation) in html
    assert escape(view.item.trap) in html and view.item.experiment in html
    assert "you chose it" in html and "not chosen" not in html  # an option rightly left out is no error
    assert html.count("you left it out") == len(view.item.expected)  # each right option the learner missed
    assert f'<a href="{view.item.notebook}"' in html  # the lesson that shows it, one click away
    assert (panel.score, panel.max_score) == (0, len(panel.items))
    assert "Score: 0 / " in panel.score_line.value
    stored = ProgressStore(store_path).load()["quiz"][view.item.id]
    assert stored["attempts"] == 1 and stored["last_correct"] is False and stored["topic"] == "scaling"

    second = panel.items[1]
    second.choose(second.item.expected)
    assert second.submit()["correct"] is True
    assert panel.score == 1 and [r["id"] for r in panel.results] == [view.item.id, second.item.id]
    assert view.submit() is None and "Already submitted" in view.message.value
    assert ProgressStore(store_path).load()["quiz"][view.item.id]["attempts"] == 1


def test_multiple_item_refuses_a_wrong_count_and_records_nothing(store_path):
    panel = show("sync-multi-gpu-essentials")
    view = panel.items[0]
    assert "pick 3" in view.widget.children[0].value
    view.choose(view.item.expected[:2])
    assert view.submit() is None
    assert "Pick exactly 3 options (you picked 2)" in view.message.value
    assert panel.results == [] and not store_path.exists()

    view.choose(view.item.expected)
    assert view.submit()["correct"] is True
    assert "Try again" in view.message.value and panel.score == 1
    assert ProgressStore(store_path).summary()["quiz"]["sync_async"] == {"answered": 1, "correct": 1, "attempts": 1}


def test_clicking_submit_takes_the_same_path(store_path):
    panel = show(["memory-zero-stage1"], record=False)
    view = panel.items[0]
    view.choose([0])  # bank order, as in answers files
    view.submit_button.click()
    assert panel.results[0]["chosen"] == [view.item.options[0].text]
    assert view.submit_button.disabled and not store_path.exists()


def test_choose_rejects_two_answers_for_a_single_item(store_path):
    view = show("memory-zero-stage1", record=False).items[0]
    with pytest.raises(ValueError, match="takes one answer"):
        view.choose([0, 1])


def test_options_are_shuffled_deterministically(store_path):
    def labels(seed):
        return [tuple(view._radio.options) if view._radio else tuple(c.description for c in view._checks)
                for view in show("bucketing", seed=seed, record=False).items]
    assert labels(7) == labels(7)
    assert labels(7) != labels(8)


def test_exam_and_css_classes_and_display(store_path):
    panel = show(exam=5, seed=1, record=False)
    assert len(panel.items) == 5
    assert "dpteach-quiz" in panel.widget._dom_classes
    assert "dpteach-quiz-score" in panel.score_line._dom_classes
    view = panel.items[0]
    assert "dpteach-quiz-submit" in view.submit_button._dom_classes
    assert "dpteach-quiz-feedback" in view.feedback._dom_classes
    assert "dpteach-quiz-message" in view.message._dom_classes
    assert "dpteach-quiz-item" in view.widget._dom_classes
    bundle = panel._repr_mimebundle_()
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == panel.widget.model_id


@pytest.mark.parametrize("kind", ["single", "multiple"])
def test_try_again_clears_the_answer_reshuffles_and_records_a_second_attempt(store_path, kind):
    bank = load_bank()
    item = next(i for i in bank.items if i.type == kind and len(i.options) >= 4)
    panel = show([item.id], seed=3)
    view = panel.items[0]
    assert view.retry_button.layout.display == "none"  # nothing to retry before a first answer
    view.choose([_wrong(item)] if kind == "single" else item.expected[:-1] + [_wrong(item)])
    assert view.submit()["correct"] is False
    first_order = list(view.order)
    assert view.submit_button.disabled and view.retry_button.layout.display is None
    view.retry_button.click()
    assert view.result is None and view.chosen == [] and view.feedback.value == ""
    assert not view.submit_button.disabled and view.retry_button.layout.display == "none"
    assert view.order != first_order and sorted(view.order) == sorted(first_order)
    shown = ([text for text, _ in view._radio.options] if kind == "single"
             else [check.description for check in view._checks])
    assert shown == [item.options[i].text for i in view.order]  # the widgets show the new order
    assert (panel.score, len(panel.results)) == (0, 0)
    view.choose(item.expected)
    assert view.submit()["correct"] is True and panel.score == 1
    stored = ProgressStore(store_path).load()["quiz"][item.id]
    assert stored["attempts"] == 2 and stored["ever_correct"] is True and stored["last_correct"] is True


def test_code_spans_render_as_code_and_a_one_topic_quiz_names_its_topic_once():
    from dpteach.quiz.widget import feedback_html, label, marked
    assert marked("torch's `powerSGD_hook` & <b>") == "torch&#x27;s <code>powerSGD_hook</code> &amp; &lt;b&gt;"
    assert label("the `bucket_cap_mb` cap") == "the bucket_cap_mb cap"
    bank = load_bank()
    items = bank.topic("failures")[:2]
    with_code = next(i for i in bank.items if "`" in i.stem or any("`" in o.text for o in i.options))
    panel = QuizPanel(items, record=False, title=f"Quiz: {items[0].topic_title}")
    headers = [view.widget.children[0].value for view in panel.items]
    assert all(items[0].topic_title not in h for h in headers)  # the heading says it once
    mixed = QuizPanel([items[0], with_code] if with_code.topic != "failures" else items, record=False, title="Quiz")
    assert items[0].topic_title in mixed.items[0].widget.children[0].value
    view = QuizPanel([with_code], record=False).items[0]
    labels = ([t for t, _ in view._radio.options] if view._radio else [c.description for c in view._checks])
    assert not any("`" in t for t in labels)  # plain-text labels drop the backticks ...
    view.choose([0])
    assert view.chosen == [with_code.options[0].text]  # ... and still stand for the bank's own text
    assert "`" not in feedback_html(with_code, list(range(len(with_code.options))), view.chosen).replace("\\`", "")


def test_a_quiz_shares_the_looks_of_its_widgets_and_each_question_still_changes_only_its_own(store_path):
    """Every model is a message the page handles before it shows the cell: a lesson's quiz of 25 questions opened 678
    (a Layout and a Style of its own for every widget); shared, about 11 per question. The one layout a question
    changes - its Try again button's, shown after a submission - is its own."""
    from ipywidgets.widgets import widget
    before = set(widget._instances)
    panel = show("frontier")
    opened = len(set(widget._instances) - before)
    assert opened <= 12 * len(panel.items), (opened, len(panel.items))
    first, second = panel.items[0], panel.items[1]
    assert first.retry_button.layout is not second.retry_button.layout
    first.choose([0] if first.item.type == "single" else list(range(first.item.select)))
    first.submit()
    assert first.retry_button.layout.display is None and second.retry_button.layout.display == "none"
    assert first.submit_button.disabled and not second.submit_button.disabled
