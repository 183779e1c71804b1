import math
import numpy as np
import pytest
from matplotlib.figure import Figure

from utils import plotting
from utils.plotting import plot_against_batch_size, plot_losses, plot_throughput, plot_timeline
from utils.train import History

pytestmark = pytest.mark.usefixtures("close_figures")


def history(scale=1.0):
    return History(logged_step=[0, 10, 20], train_loss=[2.0 * scale, 1.0 * scale, 0.5 * scale],
                   test_loss=[2.1 * scale, 1.2 * scale, 0.7 * scale], test_accuracy=[0.1, 0.5, 0.8],
                   samples_seen=[8, 88, 168], step_time_ms=[1.0] * 21, batch_size=8)


def lines_by_label(ax):
    return {line.get_label(): line for line in ax.get_lines()}


def test_plot_losses_single_history():
    h = history()
    fig = plot_losses(h)
    assert isinstance(fig, Figure)
    ax, = fig.axes
    assert ax.get_xlabel() == "step" and ax.get_ylabel() == "cross-entropy loss" and ax.get_title() == "Loss"
    lines = lines_by_label(ax)
    assert set(lines) == {"test", "train"}
    assert list(lines["test"].get_xdata()) == h.logged_step
    assert list(lines["test"].get_ydata()) == h.test_loss
    assert list(lines["train"].get_ydata()) == h.train_loss
    assert lines["train"].get_linestyle() == "--" and lines["test"].get_linestyle() == "-"
    assert lines["train"].get_color() == lines["test"].get_color()
    assert ax.get_legend() is not None


def test_plot_losses_dict_against_samples_and_given_axes():
    import matplotlib.pyplot as plt

    fig0, ax0 = plt.subplots()
    runs = {"B=8": history(), "B=64": history(0.5)}
    fig = plot_losses(runs, x="samples_seen", ax=ax0, title="Two runs")
    assert fig is fig0 and ax0.get_title() == "Two runs"
    assert ax0.get_xlabel() == "training samples seen"
    lines = lines_by_label(ax0)
    assert set(lines) == {"B=8 test", "B=8 train", "B=64 test", "B=64 train"}
    assert list(lines["B=64 train"].get_xdata()) == runs["B=64"].samples_seen
    assert list(lines["B=64 train"].get_ydata()) == runs["B=64"].train_loss
    assert lines["B=8 test"].get_color() != lines["B=64 test"].get_color()


def test_plot_throughput():
    sizes, values = [1, 2, 4, 8], [10.0, 19.0, 35.0, 60.0]
    fig = plot_throughput(sizes, {"cpu": values, "cuda": [v * 10 for v in values]})
    assert isinstance(fig, Figure)
    ax, = fig.axes
    assert ax.get_xlabel() == "batch size" and ax.get_ylabel() == "throughput (samples/s)"
    assert ax.get_title() == "Throughput against batch size"
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    lines = lines_by_label(ax)
    assert list(lines["cpu"].get_xdata()) == sizes and list(lines["cpu"].get_ydata()) == values
    assert list(lines["cuda"].get_ydata()) == [v * 10 for v in values]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["cpu", "cuda"]


def test_plot_throughput_plain_list():
    fig = plot_throughput([16, 32], [100.0, 150.0], title="T")
    ax, = fig.axes
    line, = ax.get_lines()
    assert list(line.get_xdata()) == [16, 32] and list(line.get_ydata()) == [100.0, 150.0]
    assert ax.get_title() == "T" and ax.get_legend() is None


@pytest.mark.parametrize("logy", [False, True])
def test_plot_against_batch_size(logy):
    sizes, values = np.array([8, 16, 32]), [0.9, 0.7, 0.65]
    fig = plot_against_batch_size(sizes, values, "final test loss", logy=logy)
    assert isinstance(fig, Figure)
    ax, = fig.axes
    assert ax.get_xlabel() == "batch size" and ax.get_ylabel() == "final test loss"
    assert ax.get_title() == "final test loss against batch size"
    assert ax.get_xscale() == "log" and ax.get_yscale() == ("log" if logy else "linear")
    line, = ax.get_lines()
    assert list(line.get_xdata()) == list(sizes) and list(line.get_ydata()) == values


def test_plot_timeline_draws_one_bar_per_span_on_its_lane():
    spans = [("compute", "forward", 10.0, 10.002), ("compute", "backward", 10.002, 10.006),
             ("communication", "bucket 0", 10.003, 10.007), ("communication", "bucket 1", 10.005, 10.008)]
    fig = plot_timeline(spans)
    ax = fig.axes[0]
    bars = ax.patches
    assert len(bars) == 4
    assert [round(b.get_x(), 6) for b in bars] == [0.0, 2.0, 3.0, 5.0]          # ms from the first start
    assert [round(b.get_width(), 6) for b in bars] == [2.0, 4.0, 4.0, 3.0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["compute", "communication"]
    assert bars[2].get_facecolor() == bars[3].get_facecolor() != bars[0].get_facecolor()
    assert "ms" in ax.get_xlabel()
    with pytest.raises(ValueError, match="Timeline"):
        plot_timeline([])


# --- lab 07's figures --------------------------------------------------------------------------------

def test_plot_steps_to_target_draws_points_perfect_scaling_fit_and_marks():
    from utils.plotting import plot_steps_to_target

    fig = plot_steps_to_target([16, 64, 256], [4000, 1200, 600], "steps to 50%", fit=(500.0, 100.0),
                               marks={"your reading": 120.0, "noise scale": 300.0})
    ax = fig.axes[0]
    lines = lines_by_label(ax)
    assert list(lines["measured"].get_ydata()) == [4000, 1200, 600]
    assert list(lines["perfect scaling"].get_ydata()) == [4000, 1000, 250]
    fit, = [line for label, line in lines.items() if label.startswith("S_min")]
    assert "B_crit = 100" in fit.get_label()
    assert fit.get_ydata()[0] == pytest.approx(500 * (1 + 100 / 16))
    assert list(lines["your reading"].get_xdata()) == [120.0, 120.0]
    assert ax.get_xscale() == ax.get_yscale() == "log" and ax.get_ylabel() == "steps to 50%"
    bad_fit = plot_steps_to_target([16, 64], [10, 5], "steps", fit=(float("nan"), -1.0))
    assert not any(label.startswith("S_min") for label in lines_by_label(bad_fit.axes[0]))


def test_plot_over_seeds_draws_mean_and_range_and_marks_failed_seeds():
    from utils.plotting import plot_over_seeds

    fig = plot_over_seeds([64, 1024], {"linear": [[0.5, 0.7], [0.4, None]], "sqrt": [[0.6, 0.6], [0.5, 0.55]]},
                          "batch size", "test accuracy")
    ax = fig.axes[0]
    means = {c.get_label(): list(c.lines[0].get_ydata()) for c in ax.containers}
    assert means["linear"] == pytest.approx([0.6, 0.4]) and means["sqrt"] == pytest.approx([0.6, 0.525])
    failed = [line for line in ax.get_lines() if line.get_marker() == "x"]
    assert len(failed) == 1 and list(failed[0].get_xdata()) == [1024]
    bars = ax.containers[0].lines[2][0].get_segments()               # linear's error bars
    assert bars[0][:, 1].tolist() == pytest.approx([0.5, 0.7]) and bars[1][:, 1].tolist() == pytest.approx([0.4, 0.4])


def test_plot_step_losses_and_histories():
    from utils.plotting import plot_histories, plot_step_losses

    fig = plot_step_losses({"no warm-up": [2.0, 5.0, 40.0], "warm-up": [2.0, 1.5, 1.2, 1.0]}, mark_step=2)
    lines = lines_by_label(fig.axes[0])
    assert list(lines["warm-up"].get_xdata()) == [1, 2, 3, 4] and fig.axes[0].get_yscale() == "log"
    run = [{"step": 0, "samples": 0, "train_loss": 2.0, "test_accuracy": 0.1},
           {"step": 5, "samples": 160, "train_loss": 0.5, "test_accuracy": 0.4}]
    fig = plot_histories({"small": [run, run], "large": [run]}, metrics=("train_loss", "test_accuracy"), x="samples")
    assert len(fig.axes) == 2 and fig.axes[0].get_yscale() == "log" and fig.axes[1].get_yscale() == "linear"
    assert len(fig.axes[1].get_lines()) == 3 and fig.axes[1].get_xlabel() == "training samples seen"
    assert [t.get_text() for t in fig.axes[1].get_legend().get_texts()] == ["small", "large"]
    logged = plot_histories({"small": [run]}, metrics=("test_accuracy",), x="samples", logx=True)
    assert list(logged.axes[0].get_lines()[0].get_xdata()) == [160]          # a log axis cannot show step 0


def test_plot_landscapes_and_power_law():
    import torch
    from utils.plotting import plot_landscapes, plot_power_law

    coords = [-1.0, 0.0, 1.0]
    surfaces = {"small": torch.tensor([[3.0, 2.0, 3.0], [2.0, 1.0, 2.0], [3.0, 2.0, 3.0]]),
                "large": torch.tensor([[9.0, 4.0, 9.0], [4.0, 1.0, 4.0], [9.0, 4.0, 9.0]])}
    fig = plot_landscapes([-0.5, 0.0, 0.5, 1.0, 1.5], {"train": [2, 1, 1.5, 1, 3], "test": [3, 2, 2, 2, 4]},
                          ("small", "large"), coords, surfaces)
    assert len(fig.axes) >= 3 and "a (0: small, 1: large)" == fig.axes[0].get_xlabel()
    assert "around the large solution" in fig.axes[2].get_title()
    fig = plot_power_law([100, 1000], [2.0, 1.0], slope=-0.301, intercept=math.log(2.0) + 0.301 * math.log(100))
    fit = lines_by_label(fig.axes[0])
    line, = [l for name, l in fit.items() if name.startswith("fit")]
    assert line.get_ydata()[1] == pytest.approx(1.0, rel=1e-3)


def test_plot_examples_shows_each_class_in_its_own_column():
    import torch

    x, y = torch.randn(30, 1, 8, 8), torch.arange(30) % 3
    fig = plotting.plot_examples(x, y, ["a", "b", "c"], per_class=2, title="t")
    assert len(fig.axes) == 6 and [ax.get_title() for ax in fig.axes[:3]] == ["a", "b", "c"]
    assert all(len(ax.images) == 1 for ax in fig.axes)
    for label in range(3):                   # column j shows class j's first images: samples j, then j + 3
        assert np.allclose(fig.axes[label].images[0].get_array(), x[label, 0].numpy())
        assert np.allclose(fig.axes[3 + label].images[0].get_array(), x[label + 3, 0].numpy())
    colour = plotting.plot_examples(torch.randn(6, 3, 8, 8), torch.arange(6) % 3, ["a", "b", "c"], per_class=1)
    assert colour.axes[0].images[0].get_array().shape == (8, 8, 3)


def test_plot_accuracy_and_epoch_times_draws_each_run_and_its_mean_epoch():
    runs = {"one": [dict(epoch=e, test_accuracy=a, seconds=s) for e, a, s in ((0, 0.2, 4.0), (1, 0.5, 6.0))],
            "two": [dict(epoch=e, test_accuracy=a, seconds=2.0) for e, a in ((0, 0.3), (1, 0.7), (2, 0.8))]}
    fig = plotting.plot_accuracy_and_epoch_times(runs, 0.6, timed_only={"alone": 3.5})
    left, right = fig.axes
    lines = [line for line in left.get_lines() if line.get_label() != "target"]
    assert [list(line.get_xdata()) for line in lines] == [[1, 2], [1, 2, 3]]          # epochs from 1
    assert [list(line.get_ydata()) for line in lines] == [[0.2, 0.5], [0.3, 0.7, 0.8]]
    assert [line.get_ydata()[0] for line in left.get_lines() if line.get_label() == "target"] == [0.6]
    assert [bar.get_height() for bar in right.patches] == [5.0, 2.0, 3.5]               # means, then the timed one
    assert [tick.get_text() for tick in right.get_xticklabels()] == ["one", "two", "alone"]
