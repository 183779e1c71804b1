"""utils.parle: its special cases against independent implementations (torch.optim.SGD; Entropy-SGD
from Chaudhari et al. 2017, Algorithm 1; synchronous Elastic-SGD from Zhang et al. 2015), each with
its exact conditions and where the claim does not hold; the scoping schedule (advanced once per
step, not once per tensor as in the original), and replicas on 2 gloo ranks against the one-process
simulation.

float64 throughout: a correct update differs from its written-out reference by rounding only.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from spawn_ranks import run_ranks
from utils import parle

D, CLASSES, BATCH, TOL = 5, 3, 8, 1e-12


def _data():
    g = torch.Generator().manual_seed(11)
    x = torch.randn(64, D, generator=g, dtype=torch.float64)
    return x, (x[:, 0] + x[:, 1] > 0).long() + (x[:, 2] > 1).long()


X, Y = _data()


def _batch(replica, step):
    idx = torch.randperm(len(X), generator=torch.Generator().manual_seed(1000 * replica + step))[:BATCH]
    return X[idx], Y[idx]


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(D, 7), nn.Tanh(), nn.Linear(7, CLASSES)).double()   # 4 tensors


def _grads(model, replica, step):
    model.zero_grad()
    x, y = _batch(replica, step)
    F.cross_entropy(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


def _assert_close(model, tensors, what):
    worst = max((p.detach() - t).abs().max().item() for p, t in zip(model.parameters(), tensors))
    assert worst < TOL, f"{what}: differs by {worst:.3g}"


@pytest.mark.parametrize("nesterov", [True, False])
def test_one_replica_one_step_no_coupling_is_torch_sgd(nesterov):
    model, reference = _model(), _model()
    opt = parle.Parle(model.parameters(), lr=0.1, momentum=0.9, nesterov=nesterov, gamma=0.0, rho=0.0, L=1)
    sgd = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9, nesterov=nesterov)
    for step in range(8):
        for m, o in ((model, opt), (reference, sgd)):
            _grads(m, 0, step)
            o.step()
        assert opt.due
        parle.synchronize_all([opt])
        _assert_close(model, list(reference.parameters()), f"step {step}")


# --- Independent references, written from the papers, not from utils/parle.py -------------------

def _entropy_sgd(x, rounds, L, gamma, inner_lr, lr, average_weight):
    """Entropy-SGD, Chaudhari et al. 2017, Algorithm 1, without Langevin noise: each round restarts
    x' and mu from x, takes L steps x' <- x' - inner_lr (grad f(x') - gamma (x - x')) with
    mu <- (1 - a) mu + a x', then moves x <- x - lr gamma (x - mu)."""
    probe, t = _model(), 0
    for _ in range(rounds):
        xp, mu = [w.clone() for w in x], [w.clone() for w in x]
        for _ in range(L):
            grads = _grads_at(probe, xp, 0, t)
            t += 1
            xp = [w - inner_lr * (g - gamma * (x0 - w)) for w, g, x0 in zip(xp, grads, x)]
            mu = [(1 - average_weight) * m + average_weight * w for m, w in zip(mu, xp)]
        x = [x0 - lr * gamma * (x0 - m) for x0, m in zip(x, mu)]
    return x


def _elastic_sgd(xs, steps, lr, rho):
    """Synchronous Elastic Averaging SGD, Zhang, Choromanska and LeCun 2015 (its eqs. 5 and 6): each
    worker x_i <- x_i - lr (g_i(x_i) + rho (x_i - c)); the centre variable c <- c + lr rho sum_i (x_i - c),
    both from the values at step t; c starts at the workers' common start."""
    probe, n = _model(), len(xs)
    center = [w.clone() for w in xs[0]]
    for t in range(steps):
        grads = [_grads_at(probe, xs[i], i, t) for i in range(n)]
        new = [[w - lr * (g + rho * (w - c)) for w, g, c in zip(xs[i], grads[i], center)] for i in range(n)]
        center = [c + lr * rho * sum(xs[i][k] - c for i in range(n)) for k, c in enumerate(center)]
        xs = new
    return xs


def _grads_at(model, weights, replica, step):
    with torch.no_grad():
        for p, w in zip(model.parameters(), weights):
            p.copy_(w)
    return _grads(model, replica, step)


def _run_parle(models, steps, **options):
    opts = [parle.Parle(m.parameters(), **options) for m in models]
    for step in range(steps):
        for replica, (model, opt) in enumerate(zip(models, opts)):
            _grads(model, replica, step)
            opt.step()
        if opts[0].due:
            parle.synchronize_all(opts)
    return [[p.detach().clone() for p in m.parameters()] for m in models]


def _gap(a, b):
    return max((u - v).abs().max().item() for u, v in zip(a, b))


ROUNDS, L_ENTROPY, GAMMA, LR = 4, 3, 0.05, 0.1


def test_entropy_sgd_only_under_its_exact_conditions():
    """n = 1, rho = 0 is Entropy-SGD only with momentum 0 and alpha 0 (z = the last inner iterate),
    against Entropy-SGD with mu = its last iterate (a = 1), inner step lr and outer step lr + 1/gamma:
    Parle moves x from the end of the inner loop, y_L - lr gamma (x - y_L) = x - (1 + lr gamma)(x - y_L)."""
    start = [p.detach().clone() for p in _model().parameters()]
    reference = _entropy_sgd(start, ROUNDS, L_ENTROPY, GAMMA, LR, LR + 1 / GAMMA, average_weight=1.0)
    exact = _run_parle([_model()], ROUNDS * L_ENTROPY, lr=LR, momentum=0.0, gamma=GAMMA, rho=0.0, L=L_ENTROPY,
                       alpha=0.0)[0]
    assert _gap(exact, reference) < TOL, "n = 1, rho = 0, momentum 0, alpha 0 should be Entropy-SGD exactly"
    # The lab's settings (an average z that is never restarted, momentum) are not Entropy-SGD, for any
    # outer step size Entropy-SGD might be given: compare with the closest one and with the paper's own form.
    for alpha, momentum in ((0.75, 0.0), (0.0, 0.9)):
        got = _run_parle([_model()], ROUNDS * L_ENTROPY, lr=LR, momentum=momentum, gamma=GAMMA, rho=0.0,
                         L=L_ENTROPY, alpha=alpha)[0]
        for outer in (LR + 1 / GAMMA, LR):
            other = _entropy_sgd(start, ROUNDS, L_ENTROPY, GAMMA, LR, outer, average_weight=1 - alpha)
            assert _gap(got, other) > 1e-3, f"alpha {alpha}, momentum {momentum}: unexpectedly Entropy-SGD"


def test_not_elastic_sgd_when_L_is_1_and_gamma_0():
    """L = 1, gamma = 0 couples the replicas elastically but is not Elastic-SGD: the point each replica
    is pulled to is the replicas' mean of z, recomputed at every synchronisation after the gradient
    step, where Elastic-SGD keeps a centre variable with its own elastic update. Compared with an
    independent synchronous EASGD, with the same lr and rho, no momentum, alpha 0 (z = y)."""
    n, rho, steps = 3, 0.3, 6
    start = [p.detach().clone() for p in _model().parameters()]
    easgd = _elastic_sgd([[w.clone() for w in start] for _ in range(n)], steps, LR, rho)
    got = _run_parle([_model() for _ in range(n)], steps, lr=LR, momentum=0.0, gamma=0.0, rho=rho, L=1, alpha=0.0)
    gaps = [_gap(g, e) for g, e in zip(got, easgd)]
    assert min(gaps) > 1e-4, f"L = 1, gamma = 0 matched Elastic-SGD (gaps {gaps}): the module's text is wrong"
    # With rho = 0 both are n independent SGD runs, so the two implementations agree there.
    easgd = _elastic_sgd([[w.clone() for w in start] for _ in range(n)], steps, LR, 0.0)
    got = _run_parle([_model() for _ in range(n)], steps, lr=LR, momentum=0.0, gamma=0.0, rho=0.0, L=1, alpha=0.0)
    assert max(_gap(g, e) for g, e in zip(got, easgd)) < TOL


class OriginalCounter(parle.Parle):
    """The original's bug: the step counter advanced once per parameter tensor."""

    def step(self, closure=None):
        loss = super().step(closure)
        self.t += len(self._params()) - 1
        return loss


@pytest.mark.parametrize("optimizer, correct", [(parle.Parle, True), (OriginalCounter, False)])
def test_scoping_advances_once_per_step(optimizer, correct):
    model = _model()
    opt = optimizer(model.parameters(), lr=0.05, gamma=0.001, rho=0.002, L=2, scoping=0.5)
    for step in range(7):
        _grads(model, 0, step)
        opt.step()
        if opt.due:
            parle.synchronize_all([opt])
    expected = (0.001 * 1.5 ** 3, 0.002 * 1.5 ** 3)          # 7 steps: 3 completed rounds of L = 2
    matches = opt.t == 7 and opt.coefficients() == pytest.approx(expected, rel=1e-12)
    assert matches == correct, f"t = {opt.t}, coefficients {opt.coefficients()}"


def test_scoping_stops_at_the_maxima():
    opt = parle.Parle(_model().parameters(), lr=0.1, gamma=0.6, rho=6.0, L=1, scoping=1.0)
    opt.t = 5
    assert opt.coefficients() == (1.0, 10.0)


def test_clear_errors():
    with pytest.raises(ValueError, match="L .* whole number"):
        parle.Parle(_model().parameters(), lr=0.1, L=0)
    with pytest.raises(ValueError, match="check lr, momentum"):
        parle.Parle(_model().parameters(), lr=0.0, momentum=1.0)


STEPS, L = 7, 3


def _replicas_job(rank, world_size):
    model = _model(seed=rank)                               # the replicas start apart
    opt = parle.Parle(model.parameters(), lr=0.1, gamma=0.05, rho=0.5, L=L, scoping=0.1)
    for step in range(STEPS):
        _grads(model, rank, step)
        opt.step()
        if opt.due:
            opt.synchronize()
    weights = [p.detach().numpy().copy() for p in model.parameters()]
    master = [t.numpy() for t in opt.master()]
    # train_parle: every rank ends with the same master
    trained = _model(seed=rank)
    history = parle.train_parle(trained, X, Y, steps=6, batch_size=8, lr=0.1, L=2, x_test=X, y_test=Y, eval_every=2)
    return weights, master, [p.detach().numpy().copy() for p in trained.parameters()], history


def test_replicas_on_two_ranks_match_the_simulation():
    ranks = run_ranks(_replicas_job, 2)
    models = [_model(seed=r) for r in range(2)]
    opts, losses = parle.simulate(models, _batch, STEPS, lr=0.1, gamma=0.05, rho=0.5, L=L, scoping=0.1)
    assert len(losses) == STEPS and len(losses[0]) == 2
    mean_x = [sum(o.state[p]["x"] for o, p in zip(opts, ps)) / 2 for ps in zip(*(m.parameters() for m in models))]
    for rank, (weights, master, trained, history) in enumerate(ranks):
        _assert_close(models[rank], [torch.from_numpy(w) for w in weights], f"rank {rank} against the simulation")
        for got, expected in zip(master, mean_x):
            assert (torch.from_numpy(got) - expected).abs().max() < TOL, "the master is the mean of the x's"
        for got, other in zip(master + trained, ranks[0][1] + ranks[0][2]):
            assert (got == other).all(), "every rank holds the same average"
        assert history.n_averages == 3 and history.eval_steps == [2, 4, 6] and len(history.losses) == 6
        assert len(history.eval_seconds) == 3 and all(0 < a < b for a, b in zip(history.eval_seconds, history.eval_seconds[1:]))
    assert not all((a == b).all() for a, b in zip(ranks[0][0], ranks[1][0])), "the replicas themselves differ"
