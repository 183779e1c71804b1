"""utils.labs.lab08: lab 08's runs read, compared and drawn from a sweep's numbers."""
import matplotlib

from utils.labs import lab08


def run(accuracies, times, accuracy=None, **more):
    return dict(steps=[10 * (i + 1) for i in range(len(accuracies))], accuracies=accuracies, times=times,
                accuracy=accuracies[-1] if accuracy is None else accuracy, seconds=times[-1], averaging=0.1 * times[-1],
                lr=0.1, warmup=0, workers=[0.5, 0.6], **more)


SWEEP = {(1, "1", 0): run([0.3, 0.6, 0.8], [1.0, 2.0, 3.0]), (1, "1", 1): run([0.3, 0.7, 0.82], [1.0, 2.0, 3.0]),
         (2, "1", 0): run([0.2, 0.5, 0.7], [0.5, 1.0, 1.5]), (2, "1", 1): run([0.2, 0.5, 0.72], [0.5, 1.0, 1.5]),
         (2, "one-shot", 0): run([0.1, 0.2, 0.4], [0.5, 1.0, 1.5]),
         (2, "one-shot", 1): run([0.1, 0.2, 0.45], [0.5, 1.0, 1.5])}


def test_runs_are_looked_up_by_workers_and_period_with_one_worker_the_baseline():
    runs = lab08.averaging_runs(SWEEP, [0, 1])
    assert runs(1, 16) == runs(1, 1) == [SWEEP[(1, "1", 0)], SWEEP[(1, "1", 1)]]
    assert runs(2, "one-shot")[1] is SWEEP[(2, "one-shot", 1)]


def test_time_to_target_and_the_finest_time_a_run_shows():
    r = run([0.3, 0.6, 0.8], [1.0, 2.0, 4.0])
    assert lab08.seconds_to(r, 0.6) == 2.0 and lab08.seconds_to(r, 0.9) is None
    assert lab08.measurement_interval(r) == 4.0 / 3
    assert lab08.accuracy_at(r, 19) == 0.6
    assert lab08.spread_text([0.5]) == "50.0% (one seed)" and lab08.spread_text([0.5, 0.7]) == "60.0% +- 10.0%"


def test_the_printed_verdicts_follow_the_numbers(capsys):
    runs = lab08.averaging_runs(SWEEP, [0, 1])
    target = lab08.report_baseline(runs(1, 1), 30, [0, 1])
    assert abs(target - 0.9 * 0.81) < 1e-12
    lab08.report_averaging(runs, [1, 2], [1], 0.1, target, 10, 100, times_compared=False, real_cores=2)
    lab08.report_one_shot(runs(2, "one-shot"), 2, [0, 1])
    printed = capsys.readouterr().out
    assert "target for the times below: 90% of it, 72.9%" in printed
    assert "against P = 1: lower, beyond the seeds' spread" in printed   # 71% +- 1% against 81% +- 1%
    assert "target not reached by every seed" in printed
    assert "these times measure the turns, not the methods" in printed
    assert "against its best worker: lower, beyond the seeds' spread" in printed   # 42.5% against 60%


def test_the_methods_table_ranks_only_beyond_the_spread(capsys):
    matplotlib.use("Agg")
    runs = lab08.averaging_runs(SWEEP, [0, 1])
    table = {"P = 1 (baseline)": runs(1, 1), "synchronous SGD (K = 1)": runs(2, 1)}
    fig, resolution = lab08.methods_table(table, {}, "0.1", 0.7, "2 workers", seed=0)
    assert resolution == 1.0 and len(fig.axes[0].lines) == 3   # two methods and the target
    lab08.methods_verdicts(table, 0.7, resolution, False, "they took turns")
    printed = capsys.readouterr().out
    assert "P = 1 (baseline)" in printed and "first to the target: not judged, they took turns" in printed
