"""utils.labs.lab07: the top Hessian eigenvalue against full Hessians, filter normalisation, 1-D and 2-D loss plots."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from utils.labs.lab07 import (epsilon_sharpness, filter_normalize, interpolate, random_direction, surface_2d, top_hessian_eigenvalue)
from utils.models import MLP


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same_state(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def tiny_mlp(seed):
    torch.manual_seed(seed)
    return MLP(n_layers=2, d_in=5, d_hidden=4, n_classes=3).double()


def data(n=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 5, generator=g, dtype=torch.float64), torch.randint(3, (n,), generator=g)


# --- top_hessian_eigenvalue ----------------------------------------------------------------------

def linear_regression():
    g = torch.Generator().manual_seed(0)
    scales = torch.tensor([3.0, 1, 1, 1, 0.5, 0.5], dtype=torch.float64)  # a clear gap above the 2nd eigenvalue
    x = torch.randn(50, 6, generator=g, dtype=torch.float64) * scales
    y = torch.randn(50, 1, generator=g, dtype=torch.float64)
    return nn.Linear(6, 1, bias=False).double(), x, y


def test_top_eigenvalue_of_a_quadratic_loss():
    model, x, y = linear_regression()
    exact = torch.linalg.eigvalsh(2 * x.T @ x / len(x))  # the Hessian of the mean squared error
    top = top_hessian_eigenvalue(model, F.mse_loss, x, y, iters=200, tol=1e-9)
    assert top == pytest.approx(exact[-1].item(), rel=1e-3)
    # Power iteration finds the largest *magnitude*: with the loss negated, the most negative one.
    neg = top_hessian_eigenvalue(model, lambda out, t: -F.mse_loss(out, t), x, y, iters=200, tol=1e-9)
    assert neg == pytest.approx(-exact[-1].item(), rel=1e-3)


def test_top_eigenvalue_of_an_mlp_matches_the_full_hessian():
    model, (x, y) = tiny_mlp(0), data()
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for p in model.parameters()]
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])

    def loss_of(w):
        params, start = {}, 0
        for name, shape in zip(names, shapes):
            params[name] = w[start:start + shape.numel()].reshape(shape)
            start += shape.numel()
        return F.cross_entropy(functional_call(model, params, (x,)), y)

    eigenvalues = torch.linalg.eigvalsh(torch.autograd.functional.hessian(loss_of, flat))
    exact = eigenvalues[eigenvalues.abs().argmax()].item()
    before = state(model)
    top = top_hessian_eigenvalue(model, F.cross_entropy, x, y, iters=500, tol=1e-10)
    assert top == pytest.approx(exact, rel=1e-3)
    assert same_state(state(model), before) and model.training
    assert all(p.grad is None for p in model.parameters())


def test_top_eigenvalue_skips_frozen_parameters():
    model, (x, y) = tiny_mlp(0), data()
    model.layers[0].weight.requires_grad_(False)
    # Over the last layer only, cross-entropy's Hessian is that of a convex function: >= 0.
    assert top_hessian_eigenvalue(model, F.cross_entropy, x, y, iters=100, tol=1e-8) > 0
    with pytest.raises(ValueError, match="requires grad"):
        top_hessian_eigenvalue(model.requires_grad_(False), F.cross_entropy, x, y)


# --- directions ----------------------------------------------------------------------------------

def conv_net():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.Flatten(), nn.Linear(3 * 4 * 4, 5))
    with torch.no_grad():
        net[0].weight[1].zero_()  # a dead filter
        net[3].weight[2].zero_()  # a dead neuron
    return net


def test_filter_normalize_gives_each_filter_the_weights_norm():
    net = conv_net()
    raw = random_direction(net, seed=3)
    kept = [d.clone() for d in raw]
    direction = filter_normalize(raw, net)
    assert all(torch.equal(a, b) for a, b in zip(raw, kept))  # the input is not modified
    assert [d.shape for d in direction] == [p.shape for p in net.parameters()]
    for d, r, w in zip(direction, raw, net.parameters()):
        if w.dim() == 1:  # biases, BatchNorm's scale and shift
            assert torch.equal(d, torch.zeros_like(w))
            continue
        d, r, w = (t.detach().reshape(t.shape[0], -1) for t in (d, r, w))
        torch.testing.assert_close(d.norm(dim=1), w.norm(dim=1), rtol=1e-6, atol=0)
        live = w.norm(dim=1) > 0
        assert (~live).any() and torch.equal(d[~live], torch.zeros_like(d[~live]))
        # Only rescaled: each live filter points where the random one did.
        torch.testing.assert_close(F.cosine_similarity(d[live], r[live], dim=1), torch.ones(int(live.sum())))


def test_random_direction_is_fixed_by_its_seed():
    net = conv_net()
    a, b, c = random_direction(net, 1), random_direction(net, 1), random_direction(net, 2)
    assert [t.shape for t in a] == [p.shape for p in net.parameters()]
    assert all(torch.equal(s, t) for s, t in zip(a, b))
    assert not any(torch.equal(s, t) for s, t in zip(a, c))


def test_filter_normalize_rejects_a_direction_of_another_model():
    with pytest.raises(ValueError, match="parameter tensors"):
        filter_normalize(random_direction(tiny_mlp(0), 0), conv_net())
    with pytest.raises(ValueError, match=r"direction\[0\] has shape"):
        filter_normalize([torch.zeros(2, 2)] + random_direction(conv_net(), 0)[1:], conv_net())


# --- interpolate and surface_2d --------------------------------------------------------------------

def loss_at(model, params, x, y):
    """Loss with the parameters replaced, computed apart from the code under test."""
    with torch.no_grad():
        return F.cross_entropy(functional_call(model, params, (x,)), y).item()


def test_interpolate_endpoints_midpoint_and_restore():
    model, (x, y) = tiny_mlp(0), data()
    a, b = state(tiny_mlp(1)), state(tiny_mlp(2))
    before = state(model)
    losses = interpolate(model, a, b, [0.0, 0.5, 1.0], F.cross_entropy, x, y)
    mid = {k: (a[k] + b[k]) / 2 for k in a}
    assert losses == pytest.approx([loss_at(model, a, x, y), loss_at(model, mid, x, y), loss_at(model, b, x, y)],
                                   rel=1e-12)
    assert same_state(state(model), before) and model.training


def test_interpolate_takes_buffers_from_a():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4), nn.Tanh(), nn.Linear(4, 3)).double()
    x, y = data()
    a = state(net)
    b = {k: v + 1.0 for k, v in a.items()}  # other weights and other running statistics
    b_with_a_buffers = {**b, "1.running_mean": a["1.running_mean"], "1.running_var": a["1.running_var"]}
    net.eval()
    assert interpolate(net, a, b, [1.0], F.cross_entropy, x, y)[0] == pytest.approx(
        loss_at(net, b_with_a_buffers, x, y), rel=1e-12)


def test_surface_2d_centre_layout_and_zero_directions():
    model, (x, y) = tiny_mlp(0), data()
    center = state(tiny_mlp(1))
    d1 = filter_normalize(random_direction(model, 1), model)
    zero = [torch.zeros_like(p) for p in model.parameters()]
    coords = [-0.5, 0.0, 0.5]
    before = state(model)
    centre_loss = loss_at(model, center, x, y)

    flat = surface_2d(model, center, zero, zero, coords, F.cross_entropy, x, y)
    assert flat.shape == (3, 3) and torch.allclose(flat, torch.full((3, 3), centre_loss, dtype=flat.dtype))

    surface = surface_2d(model, center, d1, zero, coords, F.cross_entropy, x, y)
    assert surface[1, 1].item() == pytest.approx(centre_loss, rel=1e-12)
    # Columns follow d1 (the x axis of plt.contour), rows d2: with d2 = 0 every row is the same.
    assert torch.allclose(surface, surface[:1].expand(3, 3)) and not torch.allclose(surface[0, 0], surface[0, 2])
    names = [n for n, _ in model.named_parameters()]
    moved = {n: center[n] + 0.5 * d for n, d in zip(names, d1)}
    assert surface[0, 2].item() == pytest.approx(loss_at(model, moved, x, y), rel=1e-12)
    assert same_state(state(model), before) and model.training


# --- epsilon_sharpness (Keskar et al. 2017, metric 2.1 with A = I) --------------------------------

def small_regression():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(20, 3, generator=g, dtype=torch.float64)
    y = torch.randn(20, 1, generator=g, dtype=torch.float64)
    model = nn.Linear(3, 1, bias=False).double()
    with torch.no_grad():
        model.weight.copy_(torch.linalg.lstsq(x, y).solution.T)     # the exact minimum of the loss
    return model, x, y


def test_epsilon_sharpness_finds_the_box_maximum_of_a_convex_loss():
    # A convex loss takes its maximum over a box at a corner: with 3 weights, 8 corners to try.
    model, x, y = small_regression()
    eps = 0.05
    w = model.weight.detach().clone()
    half = eps * (w.abs() + 1)
    base = F.mse_loss(model(x), y).item()
    corners = []
    for signs in torch.cartesian_prod(*[torch.tensor([-1.0, 1.0], dtype=torch.float64)] * 3):
        corners.append(F.mse_loss(x @ (w + signs * half).T, y).item())
    exact = 100 * (max(corners) - base) / (1 + base)
    found = epsilon_sharpness(model, F.mse_loss, x, y, epsilon=eps, steps=20)
    assert found == pytest.approx(exact, rel=1e-6)
    assert torch.equal(model.weight, w), "the weights must be restored"


def test_epsilon_sharpness_is_relative_and_grows_with_the_box():
    model, x, y = small_regression()
    small = epsilon_sharpness(model, F.mse_loss, x, y, epsilon=1e-3)
    large = epsilon_sharpness(model, F.mse_loss, x, y, epsilon=1e-2)
    assert 0 < small < large
    # At a minimum of a quadratic the rise grows with the square of the box.
    assert large / small == pytest.approx(100, rel=0.05)


def test_epsilon_sharpness_of_an_mlp_leaves_it_alone_and_is_seeded():
    model, (x, y) = tiny_mlp(0), data()
    model.train()
    before = state(model)
    a = epsilon_sharpness(model, F.cross_entropy, x, y, epsilon=1e-2, seed=3)
    assert a > 0 and model.training and same_state(before, state(model))
    assert epsilon_sharpness(model, F.cross_entropy, x, y, epsilon=1e-2, seed=3) == a


@pytest.mark.parametrize("kwargs, words", [(dict(epsilon=0), "epsilon"), (dict(steps=0), "steps")])
def test_epsilon_sharpness_rejects_bad_settings(kwargs, words):
    model, (x, y) = tiny_mlp(0), data()
    with pytest.raises(ValueError, match=words):
        epsilon_sharpness(model, F.cross_entropy, x, y, **kwargs)
