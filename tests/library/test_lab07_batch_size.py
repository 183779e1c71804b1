"""utils.labs.lab07: the noise scale against its exact value, steps to target, the critical-batch fit, LR rules."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from utils.labs.lab07 import fit_critical_batch, gradient_noise_scale, scaled_lr, steps_to_target
from utils.train import History


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def predicted_steps(batch_sizes, s_min: float, b_crit: float) -> list[float]:
    """McCandlish et al.'s S(B) = S_min (1 + B_crit / B): data with a known critical batch to fit."""
    return [s_min * (1 + b_crit / b) for b in batch_sizes]


def regression(n=512, d=32, seed=0):
    """Noisy linear regression with the model a little away from the optimum: both |G| and tr(Sigma) matter."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    w_star = torch.randn(d, 1, generator=g, dtype=torch.float64)
    y = x @ w_star + 0.5 * torch.randn(n, 1, generator=g, dtype=torch.float64)
    model = nn.Linear(d, 1, bias=False).double()
    with torch.no_grad():
        model.weight.copy_((w_star + 0.3 * torch.randn(d, 1, generator=g, dtype=torch.float64)).T)
    return model, x, y


def exact_noise(model, x, y):
    """|G|^2 and tr(Sigma) over the whole set from per-sample gradients taken one at a time."""
    grads = []
    for i in range(len(x)):
        (g,) = torch.autograd.grad(F.mse_loss(model(x[i:i + 1]), y[i:i + 1]), [model.weight])
        grads.append(g.flatten())
    grads = torch.stack(grads)
    mean = grads.mean(0)
    return float(mean @ mean), float(((grads - mean) ** 2).sum(1).mean())


def test_noise_scale_matches_per_sample_gradients():
    model, x, y = regression()
    g2, trace = exact_noise(model, x, y)
    est = gradient_noise_scale(model, F.mse_loss, x, y, b_small=8, b_big=256, n_pairs=1000, seed=0)
    # Over 30 seeds, 100 pairs gave B_simple a relative spread of 9%, so about 3% with 1000 pairs:
    # 10% is more than 3 standard deviations. G2 is much less noisy.
    assert est["G2"] == pytest.approx(g2, rel=0.03)
    assert est["S"] == pytest.approx(trace, rel=0.10)
    assert est["B_simple"] == pytest.approx(trace / g2, rel=0.10)
    assert est["B_simple"] == pytest.approx(est["S"] / est["G2"])


def test_noise_scale_is_zero_when_every_sample_has_the_same_gradient():
    model, x, y = regression(n=64, d=4)
    x, y = x[:1].repeat(64, 1), y[:1].repeat(64, 1)  # every batch gradient equals the full gradient
    (g,) = torch.autograd.grad(F.mse_loss(model(x), y), [model.weight])
    est = gradient_noise_scale(model, F.mse_loss, x, y, b_small=2, b_big=32, n_pairs=3)
    assert est["G2"] == pytest.approx(float((g * g).sum()), rel=1e-9)
    assert abs(est["S"]) < 1e-9 * est["G2"] * 32 and abs(est["B_simple"]) < 1e-6


def test_noise_scale_leaves_the_model_alone():
    model, x, y = regression(n=64, d=4)
    model.train()
    before = model.weight.detach().clone()
    gradient_noise_scale(model, F.mse_loss, x, y, b_small=2, b_big=16, n_pairs=2)
    assert model.training and model.weight.grad is None and torch.equal(model.weight, before)


@pytest.mark.parametrize("b_small, b_big, match", [(16, 16, "smaller than b_big"), (32, 16, "smaller than b_big"),
                                                   (2, 65, "larger than the data"), (0, 16, "b_small")])
def test_noise_scale_rejects_bad_batch_sizes(b_small, b_big, match):
    model, x, y = regression(n=64, d=4)
    with pytest.raises(ValueError, match=match):
        gradient_noise_scale(model, F.mse_loss, x, y, b_small=b_small, b_big=b_big)


def test_steps_to_target_on_every_history_shape():
    steps, acc = [0, 10, 20, 30], [0.1, 0.5, 0.8, 0.9]
    rows = [{"step": s, "test_accuracy": a} for s, a in zip(steps, acc)]
    history = History(logged_step=steps, test_accuracy=acc, test_loss=[2.0, 1.0, 0.6, 0.5])
    for h in ({"step": steps, "test_accuracy": acc}, rows, history):
        assert steps_to_target(h, 0.8) == 20  # reaching exactly the target counts
        assert steps_to_target(h, 0.95) is None
    assert steps_to_target(history, 0.7, key="test_loss") == 20  # a loss reaches its target from above
    assert steps_to_target(history, 0.7, key="test_loss", higher_is_better=True) == 0


def test_steps_to_target_ignores_nan_and_names_a_missing_key():
    assert steps_to_target({"step": [0, 5], "train_loss": [math.nan, 0.1]}, 0.2, key="train_loss") == 5
    with pytest.raises(ValueError, match="no 'accuracy'"):
        steps_to_target({"step": [0], "test_accuracy": [1.0]}, 0.5, key="accuracy")


BATCHES = [8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]


def test_fit_critical_batch_recovers_exact_parameters():
    steps = predicted_steps(BATCHES, 1000.0, 256.0)
    s_min, b_crit = fit_critical_batch(BATCHES, steps)
    assert s_min == pytest.approx(1000.0, rel=1e-9) and b_crit == pytest.approx(256.0, rel=1e-9)
    assert fit_critical_batch([64, 512], predicted_steps([64, 512], 50.0, 100.0)) == pytest.approx((50.0, 100.0))


def test_fit_critical_batch_with_noisy_steps():
    g = torch.Generator().manual_seed(0)
    noise = torch.exp(0.05 * torch.randn(len(BATCHES), generator=g, dtype=torch.float64))  # about 5% per run
    steps = [s * float(e) for s, e in zip(predicted_steps(BATCHES, 1000.0, 256.0), noise)]
    s_min, b_crit = fit_critical_batch(BATCHES, steps)
    # An unweighted least-squares fit of the same data gives S_min = 701 and B_crit = 390.
    assert s_min == pytest.approx(1000.0, rel=0.05) and b_crit == pytest.approx(256.0, rel=0.1)


@pytest.mark.parametrize("batches, steps, match", [([64], [100], "at least 2 different"),
                                                   ([64, 64], [100, 110], "at least 2 different"),
                                                   ([64, 128], [100, None], "never reached"),
                                                   ([64, 128], [100], "entries"),
                                                   ([64, 0], [100, 50], "> 0")])
def test_fit_critical_batch_rejects_unusable_data(batches, steps, match):
    with pytest.raises(ValueError, match=match):
        fit_critical_batch(batches, steps)


def test_scaled_lr_rules():
    assert scaled_lr(0.1, 64, 256, "none") == 0.1
    assert scaled_lr(0.1, 64, 256, "sqrt") == pytest.approx(0.2)
    assert scaled_lr(0.1, 64, 256, "linear") == pytest.approx(0.4)
    assert scaled_lr(0.1, 256, 64, "linear") == pytest.approx(0.025)  # a smaller batch scales down
    with pytest.raises(ValueError, match="'none', 'sqrt', 'linear'"):
        scaled_lr(0.1, 64, 256, "Linear")
    with pytest.raises(ValueError, match="base_batch"):
        scaled_lr(0.1, 0, 256, "linear")


def test_seed_verdict_names_a_winner_only_when_the_seeds_separate_it():
    from utils.labs.lab07 import seed_verdict

    apart = seed_verdict({"sgd": [0.50, 0.52, 0.51], "lars": [0.60, 0.58, 0.61]}, fmt=".1%")
    assert apart["leader"] == "lars" and apart["separated"]
    assert apart["text"].startswith("lars is best on every one of 3 seeds")
    assert apart["mean"]["sgd"] == pytest.approx(0.51) and apart["low"]["lars"] == 0.58

    overlap = seed_verdict({"sgd": [0.545, 0.56], "lars": [0.559, 0.54]})
    assert overlap["leader"] == "sgd" and not overlap["separated"]
    assert overlap["text"].startswith("no clear winner: sgd leads on the mean, within the seed-to-seed spread")

    tie = seed_verdict({"none": [0.44, 0.46], "sqrt": [0.44, 0.46], "linear": [0.40, 0.41]})
    assert not tie["separated"] and tie["text"].startswith("no winner: none, sqrt tie on the mean")

    one_seed = seed_verdict({"sgd": [0.545], "lars": [0.559]})
    assert not one_seed["separated"] and "one seed only, so no winner is named" in one_seed["text"]


def test_seed_verdict_counts_a_failed_seed_as_the_worst_result():
    from utils.labs.lab07 import seed_verdict

    # The leader on the mean diverged on one seed: it is not best on every seed.
    v = seed_verdict({"linear": [0.9, None, 0.88], "sqrt": [0.7, 0.72, 0.71]})
    assert v["leader"] == "linear" and not v["separated"] and v["failed"]["linear"] == 1
    assert "failed on 1 of 3 seeds" in v["text"]
    dead = seed_verdict({"linear": [None, float("nan")], "sqrt": [0.7, 0.72]})
    assert dead["leader"] == "sqrt" and dead["separated"] and "linear failed on every seed" in dead["text"]
    assert seed_verdict({"a": [None], "b": [None]})["leader"] is None


def test_seed_verdict_lower_is_better_and_bad_input():
    from utils.labs.lab07 import seed_verdict

    v = seed_verdict({"a": [1.0, 1.1], "b": [2.0, 2.1]}, higher_is_better=False)
    assert v["leader"] == "a" and v["separated"] and v["low"]["a"] == 1.1 and v["high"]["a"] == 1.0
    with pytest.raises(ValueError, match="no seeds"):
        seed_verdict({"a": []})
    with pytest.raises(ValueError, match="no settings"):
        seed_verdict({})


def test_paired_difference_says_when_every_seed_agrees():
    from utils.labs.lab07 import paired_difference

    agree = paired_difference([0.59, 0.60, 0.58], [0.46, 0.43, 0.47], fmt=".1%")
    assert agree["consistent"] and agree["mean"] == pytest.approx(-0.1367, abs=1e-4)
    assert agree["low"] == pytest.approx(-0.17) and agree["high"] == pytest.approx(-0.11)
    assert agree["text"] == ("-13.7% (-17.0% to -11.0%), the same sign on every one of 3 seeds "
                             "(1 chance in 4 if there were no difference)")
    split = paired_difference([1.0, 1.0], [1.2, 0.9])
    assert not split["consistent"] and "disagree on the sign, within the noise" in split["text"]
    assert not paired_difference([1.0, 1.0], [1.0, 1.5])["consistent"]      # a zero difference is no sign
    one = paired_difference([1.0], [2.0])
    assert not one["consistent"] and "one seed only" in one["text"]


def test_paired_difference_rejects_unpaired_or_failed_seeds():
    from utils.labs.lab07 import paired_difference

    with pytest.raises(ValueError, match="the same seeds"):
        paired_difference([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="finite"):
        paired_difference([1.0, float("nan")], [1.0, 2.0])


def test_train_run_stops_at_a_training_loss():
    from utils.labs.lab07 import train_run

    run = train_run(100, 0.5, momentum=0.9, steps=400, eval_every=1, target_train_loss=1.0, num_samples=500)
    assert run["steps_to_target"] is not None and run["steps_to_target"] < 400
    assert run["final"]["train_loss"] <= 1.0 < min(h["train_loss"] for h in run["history"][:-1])
    assert run["final"]["step"] == run["steps_to_target"]


def test_compared_says_what_outcomes_compare_decides_and_records_it(tmp_path, monkeypatch):
    import json

    from utils.labs.lab07 import compared
    record = tmp_path / "v.jsonl"
    monkeypatch.setenv("COURSE_VERDICTS", str(record))
    apart = compared("large", [0.40, 0.42], "small", [0.55, 0.57], percent=True, words={"lower": "a gap"})
    assert apart["conclusion"] == "lower" and apart["text"].endswith(": a gap") and "41.0%" in apart["text"]
    close = compared("large", [0.50, 0.56], "small", [0.55, 0.57], percent=True, words={"lower": "a gap"})
    assert close["conclusion"] == "within the spread" and "a gap" not in close["text"]
    assert compared("a", [1.0], "b", [2.0])["conclusion"] == "not judged"
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert [line["conclusion"] for line in lines] == ["lower", "within the spread", "not judged"]


def test_best_of_counts_a_diverged_seed_and_names_a_winner_only_beyond_the_spread(tmp_path, monkeypatch):
    from utils.labs.lab07 import best_of
    monkeypatch.setenv("COURSE_VERDICTS", str(tmp_path / "v.jsonl"))
    clear = best_of({"sgd": [0.50, 0.52], "lars": [0.60, 0.61]}, what="test accuracy")
    assert clear["leader"] == "lars" and "best test accuracy: lars" in clear["text"]
    failed = best_of({"linear": [0.9, None], "sqrt": [0.7, 0.72]}, what="test accuracy")
    assert failed["leader"] is None and "diverged on 1 of 2 seeds" in failed["text"]
    assert failed["mean"]["linear"] == pytest.approx(0.45)
