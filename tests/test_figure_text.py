"""A figure's description is read from the figure (``dpteach/widgets/figure_text.py``): matplotlib itself is the
oracle - the numbers drawn are the numbers said."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from dpteach.widgets.figure_text import MAX_CHARS, describe  # noqa: E402


def test_a_line_is_said_from_its_first_to_its_last_point_with_its_extremes():
    fig, ax = plt.subplots()
    batches = [32, 64, 128, 256, 512]
    ax.plot(batches, [90, 61, 40, 24, 24], label="steps to the target")
    ax.plot(batches, [1, 1, 1, 1, 1], label="flat")
    ax.plot(batches, [5, 4, 3, 2, 1], label="_hidden helper line")
    ax.set(title="Batch size", xlabel="global batch", ylabel="steps")
    said = describe(fig)
    assert said.startswith("Figure. Batch size: lines of steps against global batch")
    assert "steps to the target: from 90 at 32 to 24 at 512 (lowest 24 at 256, highest 90 at 32)" in said
    assert "flat: 1 throughout" in said and "hidden" not in said
    plt.close(fig)


def test_bars_are_said_by_their_tick_labels_and_panels_in_reading_order():
    fig, (left, right) = plt.subplots(1, 2)
    right.bar([0, 1, 2], [650, 326, 2058.4], tick_label=["fp32", "bf16", "fp16"])
    right.set(title="memory", ylabel="KiB")
    left.plot([1, 2], [0.5, 0.25], label="loss")
    left.set(title="training")
    said = describe(fig)
    assert said.startswith("Figure with 2 panels. training:")
    assert said.index("training") < said.index("memory")
    assert "fp32: 650; bf16: 326; fp16: 2,058" in said


@pytest.mark.parametrize("count", [3, 40])
def test_many_series_are_counted_not_listed_and_the_text_stays_short(count):
    fig, ax = plt.subplots()
    for i in range(count):
        ax.plot([0, 1], [i, i + 1], label=f"series number {i} with a rather long legend entry")
    said = describe(fig)
    assert len(said) <= MAX_CHARS + 10
    assert ("more" in said) == (count > 8)
    plt.close(fig)


def test_horizontal_and_grouped_bars_are_said_by_their_category():
    fig, (across, grouped) = plt.subplots(1, 2)
    across.barh([0, 1], [3.5e6, 2.0e5], tick_label=["model states", "activations"])
    across.set_xlabel("bytes per rank")
    for offset, (series, values) in zip((-0.2, 0.2), {"plain": [13.3, 32.9], "checkpointed": [2.27, 46.2]}.items()):
        grouped.bar([i + offset for i in range(2)], values, width=0.4, label=series)
    grouped.set_xticks([0, 1], ["memory", "time"])
    said = describe(fig)
    assert "model states: 3.5e+06; activations: 200,000" in said
    assert "plain, memory: 13.3; plain, time: 32.9; checkpointed, memory: 2.27; checkpointed, time: 46.2" in said
    plt.close(fig)


def test_a_timeline_is_said_as_spans_on_its_rows():
    fig, ax = plt.subplots()
    ax.broken_barh([(0, 40), (50, 30)], (0, 0.8))
    ax.broken_barh([(40, 45)], (1, 0.8))
    ax.set_yticks([0.4, 1.4], ["rank 0 compute", "rank 0 comm"])
    ax.set(xlabel="time (ms)", title="overlap: exposed communication 5 ms")
    said = describe(fig)
    assert said.startswith("Figure. overlap: exposed communication 5 ms: spans on the rows rank 0 compute, rank 0 comm "
                           "over time (ms), from")
    plt.close(fig)
