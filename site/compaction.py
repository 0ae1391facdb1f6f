"""What a stored run keeps of its widgets: only what a reader of the site can see (``execute.py`` stores the runs).

Widget models that no displayed view reaches are dropped; a quiz widget keeps only its heading (the site links
it to its topic's page, which shows every item); layout and style models keep only the settings that differ
from their defaults.
"""
from __future__ import annotations

WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
META = "dpteach_site"


def reachable_models(notebook) -> set[str]:
    """Ids of the widget models a reader can reach: those a cell's output displays, and every model they
    refer to (children, layouts, styles, widgets shown inside an Output), recursively."""
    state = notebook.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    seen: set[str] = set()
    todo = [ref for cell in notebook.cells for output in cell.get("outputs", []) for ref in _refs(output)]
    while todo:
        model = todo.pop()
        if model in seen or model not in state:
            continue
        seen.add(model)
        todo += _refs(state[model])
    return seen


def _refs(value) -> list[str]:
    """Model ids referred to anywhere in a JSON value: "IPY_MODEL_<id>" strings and widget views' model_id."""
    found = []
    if isinstance(value, str):
        if value.startswith("IPY_MODEL_"):
            found.append(value[len("IPY_MODEL_"):])
    elif isinstance(value, list):
        for entry in value:
            found += _refs(entry)
    elif isinstance(value, dict):
        if WIDGET_VIEW in value and isinstance(value[WIDGET_VIEW], dict):
            found.append(value[WIDGET_VIEW].get("model_id"))
        for entry in value.values():
            found += _refs(entry)
    return [ref for ref in found if ref]


def prune_widget_state(notebook) -> tuple[int, int]:
    """Drop the widget models no displayed view reaches (a panel rebuilt by a later cell, closed widgets'
    leftovers); return (models kept, models dropped)."""
    widgets = notebook.metadata.get("widgets", {}).get(WIDGET_STATE)
    if not widgets:
        return 0, 0
    keep = reachable_models(notebook)
    state = widgets.get("state", {})
    dropped = [model for model in state if model not in keep]
    for model in dropped:
        del state[model]
    return len(state), len(dropped)


QUIZ_CLASS = "dpteach-quiz"  # the VBox of dpteach.quiz.QuizPanel


def shrink_quizzes(notebook) -> int:
    """Keep of each quiz widget only its heading, and write into the output that shows it which topics its
    items come from (metadata ``dpteach_site.quiz``): the site links a lesson's quiz to that topic's page,
    where every item is written out with its answer, so the items' own widgets (most of a lesson's stored
    widget state) are shown nowhere. Returns the number of quizzes shrunk."""
    import html as html_module
    import re as re_module

    from dpteach.quiz import topic_titles
    state = notebook.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    by_title = {title: topic for topic, title in topic_titles().items()}
    shrunk = 0
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            view = output.get("data", {}).get(WIDGET_VIEW)
            model = state.get(view.get("model_id")) if isinstance(view, dict) else None
            if model is None or QUIZ_CLASS not in model["state"].get("_dom_classes", []):
                continue
            if "quiz" in output.get("metadata", {}).get(META, {}):
                continue  # shrunk already (--recompact of a stored run): its items are gone, its record stays
            children = [ref[len("IPY_MODEL_"):] for ref in model["state"].get("children", [])]
            texts = {child: state.get(child, {}).get("state", {}).get("value", "") for child in children}
            heading = [child for child in children if texts[child].startswith("<h3>")]
            items = [child for child in children if "dpteach-quiz-item" in state.get(child, {}).get("state", {}).get(
                "_dom_classes", [])]
            topics = []
            for item in items:  # each item's first child: "<b>Question N</b> &middot; topic title &middot; ..."
                first = state[item]["state"]["children"][0][len("IPY_MODEL_"):]
                parts = state.get(first, {}).get("state", {}).get("value", "").split(" &middot; ")
                topic = by_title.get(html_module.unescape(parts[1])) if len(parts) > 1 else None
                if topic and topic not in topics:
                    topics.append(topic)
            title = re_module.sub(r"<[^>]+>", "", texts[heading[0]]) if heading else "Quiz"
            if not topics and html_module.unescape(title).startswith("Quiz: "):  # one topic: named once, above
                named = by_title.get(html_module.unescape(title)[len("Quiz: "):])
                topics = [named] if named else []
            output.setdefault("metadata", {})[META] = {"quiz": {"title": html_module.unescape(title),
                                                                "items": len(items), "topics": topics}}
            model["state"]["children"] = [f"IPY_MODEL_{child}" for child in heading]
            shrunk += 1
    return shrunk


def compact_widget_state(notebook) -> None:
    """Leave out of the layout and style models the settings left at their default (None: every one of
    ipywidgets' layout and style traits defaults to None) and the model's name and module, which the entry
    already gives: most of a panel's stored state, changing nothing it shows (a widget manager that loads
    the state fills the defaults back in)."""
    state = notebook.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    for model in state.values():
        if model.get("model_name", "").endswith(("LayoutModel", "StyleModel")):
            model["state"] = {key: value for key, value in model["state"].items()
                              if value is not None and model.get(key.lstrip("_")) != value}  # _model_name: said above
