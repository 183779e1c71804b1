import itertools
import re

import pytest
import torch
import torch.nn.functional as F

from utils.data import Dataset
from utils.models import MLP
from utils import train as train_module
from utils.train import History, batch_indices, check_training_config, evaluate, log_line, time_steps, train, train_step


def separable(n_train=96, n_test=40, d_in=6, n_classes=3, seed=0):
    """A small, learnable problem: Gaussian blobs around well-separated centres."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(n_classes, d_in, generator=g) * 3
    def draw(n):
        y = torch.randint(0, n_classes, (n,), generator=g)
        return centres[y] + torch.randn(n, d_in, generator=g) * 0.5, y
    x_tr, y_tr = draw(n_train)
    x_te, y_te = draw(n_test)
    return Dataset("blobs", x_tr, y_tr, x_te, y_te, n_classes)


# --- check_training_config -------------------------------------------------------------------

def test_config_accepts_valid_settings():
    check_training_config(100, 100, 0.1, n_steps=1, log_every=1)
    check_training_config(100, 1, 1e-6, n_steps=5, log_every=50)


def test_batch_larger_than_train_set_names_fix():
    with pytest.raises(ValueError) as info:
        check_training_config(50, 64, 0.1)
    message = str(info.value)
    assert "batch_size=64" in message and "50 samples" in message
    assert "use batch_size <= 50 or a larger train_size" in message


@pytest.mark.parametrize("lr", [0, -0.1, float("nan")])
def test_lr_must_be_positive(lr):
    with pytest.raises(ValueError, match=r"learning rate must be > 0, got lr="):
        check_training_config(100, 10, lr)


@pytest.mark.parametrize("n_steps", [0, -3, 2.5])
def test_n_steps_at_least_one(n_steps):
    with pytest.raises(ValueError, match=rf"n_steps must be a whole number >= 1, got {n_steps!r}"):
        check_training_config(100, 10, 0.1, n_steps=n_steps)


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(batch_size=0), "batch_size must be a whole number >= 1"),
    (dict(batch_size=4.0), "batch_size must be a whole number >= 1"),
    (dict(log_every=0), "log_every must be a whole number >= 1"),
])
def test_other_settings(kwargs, pattern):
    settings = dict(n_train=100, batch_size=10, lr=0.1) | kwargs
    with pytest.raises(ValueError, match=pattern):
        check_training_config(**settings)


@pytest.mark.timeout(30)  # without the check, batch_indices would loop for ever
def test_train_checks_config_first():
    with pytest.raises(ValueError, match="larger than the training set"):
        train(MLP(1, 6, 4, 3), separable(n_train=10), batch_size=11, n_steps=1, progress=False)


# --- batch_indices ---------------------------------------------------------------------------

def test_batch_indices_each_sample_once_per_epoch_partial_dropped():
    n, batch_size = 23, 5  # 4 full batches, 3 samples left over each epoch
    batches = batch_indices(n, batch_size, seed=1)
    for _ in range(3):
        epoch = [next(batches) for _ in range(4)]
        assert all(b.shape == (batch_size,) for b in epoch)
        seen = torch.cat(epoch)
        assert len(set(seen.tolist())) == 20  # no repeat within an epoch
        assert seen.min() >= 0 and seen.max() < n


def test_batch_indices_reshuffles_each_epoch_and_is_seeded():
    first = list(itertools.islice(batch_indices(12, 4, seed=0), 6))
    again = list(itertools.islice(batch_indices(12, 4, seed=0), 6))
    other = list(itertools.islice(batch_indices(12, 4, seed=1), 6))
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not all(torch.equal(a, b) for a, b in zip(first, other))
    assert not torch.equal(torch.cat(first[:3]), torch.cat(first[3:]))  # new permutation
    assert sorted(torch.cat(first[:3]).tolist()) == list(range(12))
    assert not torch.equal(torch.cat(first[:3]), torch.arange(12))


def test_batch_indices_without_shuffle_walks_in_order():
    batches = list(itertools.islice(batch_indices(10, 3, shuffle=False), 6))
    expected = [[0, 1, 2], [3, 4, 5], [6, 7, 8]] * 2
    assert [b.tolist() for b in batches] == expected


# --- evaluate --------------------------------------------------------------------------------

@pytest.mark.parametrize("n, batch_size", [(103, 10), (7, 1024), (50, 7)])
def test_evaluate_equals_full_batch(n, batch_size):
    torch.manual_seed(0)
    model = MLP(2, 8, 5, 3)
    x, y = torch.randn(n, 8), torch.randint(0, 3, (n,))
    with torch.no_grad():
        logits = model(x)
        expected_loss = F.cross_entropy(logits, y).item()
        expected_acc = (logits.argmax(1) == y).float().mean().item()
    loss, acc = evaluate(model, x, y, batch_size=batch_size)
    assert isinstance(loss, float) and isinstance(acc, float)
    assert loss == pytest.approx(expected_loss, rel=1e-5)
    assert acc == pytest.approx(expected_acc)
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("training", [True, False])
def test_evaluate_restores_mode(training):
    model = MLP(1, 4, 3, 2).train(training)
    seen = []
    model.register_forward_pre_hook(lambda module, args: seen.append(module.training))
    evaluate(model, torch.randn(9, 4), torch.randint(0, 2, (9,)), batch_size=4)
    assert seen == [False, False, False]  # evaluated in eval mode
    assert model.training is training


# --- train -----------------------------------------------------------------------------------

LOG = re.compile(r"^step (\d+) \| train_loss (\d+\.\d{4}) \| test_loss (\d+\.\d{4}) \| step time (\d+\.\d+) ?ms$")


def test_train_learns_and_logs(capsys):
    torch.manual_seed(0)
    data = separable()
    model = MLP(2, 6, 16, 3)
    initial_loss, _ = evaluate(model, data.x_test, data.y_test)
    history = train(model, data, batch_size=16, lr=0.2, n_steps=23, log_every=5, device="cpu",
                    progress=False)
    assert history.logged_step == [0, 5, 10, 15, 20, 22]
    n_logs = len(history.logged_step)
    assert len(history.train_loss) == len(history.test_loss) == len(history.test_accuracy) == n_logs
    assert history.samples_seen == [(s + 1) * 16 for s in history.logged_step]
    assert len(history.step_time_ms) == 23 and all(t > 0 for t in history.step_time_ms)
    assert history.batch_size == 16 and history.device == "cpu"
    assert history.mean_step_ms > 0 and history.samples_per_s > 0
    # It learns.
    assert history.test_loss[-1] < 0.5 * initial_loss
    assert history.train_loss[-1] < history.train_loss[0]
    assert history.test_accuracy[-1] > 0.9
    # The logged losses are the model's losses at that point: the last one is the final model's.
    assert history.test_loss[-1] == pytest.approx(evaluate(model, data.x_test, data.y_test)[0], rel=1e-5)
    assert history.train_loss[-1] == pytest.approx(evaluate(model, data.x_train, data.y_train)[0], rel=1e-5)
    assert model.training
    # The seed's log line, once per logged step, with the same numbers.
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == n_logs
    for line, step, tr, te in zip(lines, history.logged_step, history.train_loss, history.test_loss):
        match = LOG.match(line)
        assert match, line
        assert int(match[1]) == step
        assert float(match[2]) == pytest.approx(tr, abs=5e-5)
        assert float(match[3]) == pytest.approx(te, abs=5e-5)
        assert float(match[4]) > 0


def test_log_line_format():
    line = log_line(7, 1.23456, 0.5, 3.14159)
    match = LOG.match(line)
    assert match and match.groups() == ("7", "1.2346", "0.5000", "3.14")


def test_train_logs_every_step_and_single_step(capsys):
    data = separable(n_train=20)
    h = train(MLP(1, 6, 4, 3), data, batch_size=20, n_steps=3, log_every=1, progress=False)
    assert h.logged_step == [0, 1, 2]
    h = train(MLP(1, 6, 4, 3), data, batch_size=20, n_steps=1, log_every=100, progress=False)
    assert h.logged_step == [0] and len(h.step_time_ms) == 1
    assert len(capsys.readouterr().out.strip().splitlines()) == 4


def test_train_quiet_and_eval_size(capsys):
    data = separable(n_train=60, n_test=40)
    torch.manual_seed(0)
    model = MLP(1, 6, 4, 3)
    h = train(model, data, batch_size=10, n_steps=4, log_every=10, eval_size=8, progress=False,
              print_log=False)
    assert capsys.readouterr().out == ""
    assert h.logged_step == [0, 3]
    assert h.test_loss[-1] == pytest.approx(evaluate(model, data.x_test[:8], data.y_test[:8])[0], rel=1e-5)
    assert h.train_loss[-1] == pytest.approx(evaluate(model, data.x_train[:8], data.y_train[:8])[0], rel=1e-5)


def test_train_with_progress_bar_still_logs(capsys):
    h = train(MLP(1, 6, 4, 3), separable(n_train=20), batch_size=10, n_steps=2, log_every=1,
              progress=True)
    out = capsys.readouterr().out.strip().splitlines()
    assert [LOG.match(line)[1] for line in out] == ["0", "1"]
    assert len(h.step_time_ms) == 2


def _run(seed, shuffle=True):
    torch.manual_seed(123)
    model = MLP(2, 6, 8, 3)
    h = train(model, separable(), batch_size=8, lr=0.1, n_steps=15, log_every=4, seed=seed,
              shuffle=shuffle, progress=False, print_log=False)
    return h, [p.detach().clone() for p in model.parameters()]


def test_same_seed_same_results():
    (h1, p1), (h2, p2) = _run(seed=0), _run(seed=0)
    assert h1.train_loss == h2.train_loss and h1.test_loss == h2.test_loss
    assert all(torch.equal(a, b) for a, b in zip(p1, p2))
    h3, p3 = _run(seed=1)
    assert not all(torch.equal(a, b) for a, b in zip(p1, p3))


def test_shuffle_false_is_sequential():
    (h1, p1), (h2, p2) = _run(seed=0, shuffle=False), _run(seed=5, shuffle=False)
    # Without shuffling the seed does not matter: batches are 0..7, 8..15, ...
    assert all(torch.equal(a, b) for a, b in zip(p1, p2))
    # And the result equals plain SGD on consecutive batches with the linear LR decay.
    data = separable()
    torch.manual_seed(123)
    model = MLP(2, 6, 8, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1.0, end_factor=0.3, total_iters=15)
    n_batches = len(data.x_train) // 8
    for step in range(15):
        i = (step % n_batches) * 8
        loss = F.cross_entropy(model(data.x_train[i:i + 8]), data.y_train[i:i + 8])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(p1, model.parameters()))
    assert h1.test_loss[-1] > 0


def test_history_defaults():
    h = History(step_time_ms=[10.0, 2.0, 4.0], batch_size=6)
    assert h.mean_step_ms == pytest.approx(3.0)  # first step skipped
    assert h.samples_per_s == pytest.approx(2000.0)
    assert History(step_time_ms=[5.0]).mean_step_ms == 5.0


def test_time_steps_positive_float():
    torch.manual_seed(0)
    x, y = torch.randn(32, 6), torch.randint(0, 3, (32,))
    model = MLP(2, 6, 8, 3)
    before = [p.detach().clone() for p in model.parameters()]
    ms = time_steps(model, x, y, batch_size=8, n_steps=3, warmup=1, device="cpu")
    assert isinstance(ms, float) and ms > 0
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # it did train


@pytest.mark.timeout(30)
def test_time_steps_checks_config():
    with pytest.raises(ValueError, match="larger than the training set"):
        time_steps(MLP(1, 6, 4, 3), torch.randn(4, 6), torch.zeros(4, dtype=torch.long), batch_size=8)


def test_epoch_batches_follow_batch_indices_and_are_views():
    x = torch.arange(23 * 2, dtype=torch.float32).reshape(23, 2)
    y = torch.arange(23)
    for shuffle in (True, False):
        pairs = train_module.epoch_batches(x, y, 5, seed=3, shuffle=shuffle)
        indices = train_module.batch_indices(23, 5, seed=3, shuffle=shuffle)
        for _ in range(12):  # three epochs of four batches
            xb, yb = next(pairs)
            index = next(indices)
            assert torch.equal(yb, y[index]) and torch.equal(xb, x[index])
    xb, _ = next(train_module.epoch_batches(x, y, 5, shuffle=False))
    assert xb.data_ptr() == x.data_ptr(), "without shuffling a batch is a view, not a copy"
    with pytest.raises(ValueError, match="between 1 and"):
        next(train_module.epoch_batches(x, y, 24))


def test_train_step_is_one_cross_entropy_step_and_returns_the_loss_detached():
    torch.manual_seed(0)
    x, y = torch.randn(16, 10), torch.randint(0, 3, (16,))
    ours, by_hand = (MLP(2, 10, 8, 3) for _ in range(2))
    by_hand.load_state_dict(ours.state_dict())
    ours.layers[0].weight.grad = torch.ones_like(ours.layers[0].weight)   # a stale gradient: zeroed first
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (ours, by_hand)]
    loss = train_step(ours, optimizers[0], x, y)
    expected = F.cross_entropy(by_hand(x), y)
    expected.backward()
    optimizers[1].step()
    assert not loss.requires_grad and torch.equal(loss, expected.detach())
    for a, b in zip(ours.parameters(), by_hand.parameters()):
        assert torch.equal(a, b)
