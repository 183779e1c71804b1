"""utils.parle: Parle's special cases step for step against their plain algorithms written out
here, the scoping schedule (advanced once per step, not once per tensor as in the original), and
replicas on 2 gloo ranks against the one-process simulation.

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


def test_elastic_sgd_when_L_is_1_and_gamma_0():
    n, lr, m, rho, s = 3, 0.2, 0.5, 0.3, 0.1
    models = [_model(seed) for seed in range(n)]
    mine = [copy.deepcopy(model) for model in models]
    options = dict(lr=lr, momentum=m, nesterov=False, gamma=0.0, rho=rho, L=1, alpha=0.0, scoping=s)
    opts = [parle.Parle(model.parameters(), **options) for model in models]
    # Elastic-SGD written out: a heavy-ball gradient step on every replica, then each replica pulled
    # towards the replicas' mean by rho_t (scoped every step) from where it stood before that step.
    ws = [[p.detach().clone() for p in model.parameters()] for model in mine]
    before = [[w.clone() for w in ws[a]] for a in range(n)]
    inner = [[torch.zeros_like(w) for w in ws[0]] for _ in range(n)]
    outer = [[torch.zeros_like(w) for w in ws[0]] for _ in range(n)]
    for step in range(6):
        for a in range(n):
            with torch.no_grad():
                for p, w in zip(mine[a].parameters(), ws[a]):
                    p.copy_(w)
            for w, b, g in zip(ws[a], inner[a], _grads(mine[a], a, step)):
                b.mul_(m).add_(g)
                w.sub_(lr * b)
            _grads(models[a], a, step)
            opts[a].step()
        rho_t = min(rho * (1 + s) ** (step + 1), 10.0)
        center = [sum(ws[a][i] for a in range(n)) / n for i in range(len(ws[0]))]
        for a in range(n):
            for w, w0, b, c in zip(ws[a], before[a], outer[a], center):
                b.mul_(m).add_(rho_t * (w0 - c))
                w.sub_(lr * b)
            before[a] = [w.clone() for w in ws[a]]
        parle.synchronize_all(opts)
        for a in range(n):
            _assert_close(models[a], ws[a], f"replica {a}, step {step}")


def test_entropy_sgd_when_one_replica_and_rho_0():
    lr, m, gamma, L, alpha, s = 0.1, 0.9, 0.05, 3, 0.75, 0.2
    model, probe = _model(), _model()
    opt = parle.Parle(model.parameters(), lr=lr, momentum=m, nesterov=True, gamma=gamma, rho=0.0, L=L,
                      alpha=alpha, scoping=s)
    # Entropy-SGD's loop written out: L proximal Nesterov steps with an average z, then x moves.
    y = [p.detach().clone() for p in probe.parameters()]
    x, z = [w.clone() for w in y], [w.clone() for w in y]
    inner, outer = [torch.zeros_like(w) for w in y], [torch.zeros_like(w) for w in y]
    t = 0
    for _ in range(4):
        for _ in range(L):
            with torch.no_grad():
                for p, w in zip(probe.parameters(), y):
                    p.copy_(w)
            gamma_t = min(gamma * (1 + s) ** (t // L), 1.0)
            for w, x0, zi, b, g in zip(y, x, z, inner, _grads(probe, 0, t)):
                g = g + gamma_t * (w - x0)
                b.mul_(m).add_(g)
                w.sub_(lr * (g + m * b))
                zi.mul_(alpha).add_((1 - alpha) * w)
            _grads(model, 0, t)
            opt.step()
            t += 1
            _assert_close(model, y, f"inner step {t}")
        gamma_t = min(gamma * (1 + s) ** (t // L), 1.0)
        for w, x0, zi, b in zip(y, x, z, outer):
            f = gamma_t * (x0 - zi)
            b.mul_(m).add_(f)
            w.sub_(lr * (f + m * b))
            x0.copy_(w)
        assert opt.due
        parle.synchronize_all([opt])
        _assert_close(model, y, f"synchronisation after step {t}")


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
    assert not all((a == b).all() for a, b in zip(ranks[0][0], ranks[1][0])), "the replicas themselves differ"
