import math

import numpy as np
import pytest
import torch
from torch import nn

from utils.models import CNN, MLP, WideResNet, mlp_layer_shapes


@pytest.mark.parametrize("n_layers, expected", [
    (1, [(10, 3)]),
    (2, [(10, 6), (6, 3)]),
    (4, [(10, 6), (6, 6), (6, 6), (6, 3)]),
])
def test_layer_shapes(n_layers, expected):
    assert mlp_layer_shapes(n_layers, 10, 6, 3) == expected
    model = MLP(n_layers, 10, 6, 3)
    assert isinstance(model.layers, nn.ModuleList) and len(model.layers) == n_layers
    for layer, (fan_in, fan_out) in zip(model.layers, expected):
        assert isinstance(layer, nn.Linear)
        assert layer.bias is None
        assert tuple(layer.weight.shape) == (fan_out, fan_in)
    assert sum(p.numel() for p in model.parameters()) == sum(i * o for i, o in expected)


def manual_forward(model, x):
    weights = [layer.weight for layer in model.layers]
    out = x.flatten(1)
    for w in weights[:-1]:
        out = torch.tanh(out @ w.T)
    return out @ weights[-1].T


@pytest.mark.parametrize("n_layers", [1, 2, 4])
def test_forward_is_tanh_between_layers_not_after_last(n_layers):
    torch.manual_seed(0)
    model = MLP(n_layers, 10, 6, 3)
    x = torch.randn(7, 10) * 3
    out = model(x)
    assert out.shape == (7, 3)
    assert torch.allclose(out, manual_forward(model, x), atol=1e-6)
    # Logits are not squashed: a bounded output would mean tanh after the last layer.
    with torch.no_grad():
        model.layers[-1].weight.mul_(50)
    assert model(x).abs().max() > 1.5


def test_forward_flattens_images():
    torch.manual_seed(0)
    model = MLP(2, 16, 5, 4)
    x = torch.randn(3, 1, 4, 4)
    assert torch.allclose(model(x), model(x.reshape(3, 16)))


def test_kaiming_uniform_bound():
    torch.manual_seed(0)
    model = MLP(2, 1024, 256, 10)
    for layer in model.layers:
        fan_in = layer.weight.shape[1]
        bound = math.sqrt(6 / fan_in)
        w = layer.weight.detach()
        assert w.abs().max() <= bound
        # Fills the range (PyTorch's default init would stop at 1/sqrt(fan_in)).
        assert w.abs().max() > 0.95 * bound
        # Uniform on [-bound, bound]: variance bound^2 / 3 = 2 / fan_in.
        assert w.var().item() == pytest.approx(2 / fan_in, rel=0.1)


@pytest.mark.parametrize("bad", [dict(n_layers=0), dict(n_layers=-1), dict(d_in=0), dict(d_hidden=2.5),
                                 dict(n_classes="3"), dict(n_layers=True)])
def test_invalid_sizes(bad):
    sizes = dict(n_layers=2, d_in=4, d_hidden=3, n_classes=2) | bad
    name, value = next(iter(bad.items()))
    with pytest.raises(ValueError, match=f"{name} must be a whole number >= 1, got {value!r}"):
        MLP(**sizes)


def test_numpy_integer_sizes_accepted():
    model = MLP(np.int64(2), np.int64(8), 5, np.int32(3))
    assert model(torch.randn(2, 8)).shape == (2, 3)
    assert mlp_layer_shapes(np.int64(2), 8, 5, 3) == [(8, 5), (5, 3)]
    assert all(type(v) is int for shape in mlp_layer_shapes(np.int64(2), 8, 5, 3) for v in shape)



# --- CNN (seed 003) ---------------------------------------------------------------------------

def cnn_parameter_count(c, h, w, channels=(16, 32), hidden=128, n_classes=10):
    """conv1 and conv2 (3x3, with bias), FC1 on what three 2x2 poolings leave, FC2."""
    c1, c2 = channels
    return (9 * c * c1 + c1) + (9 * c1 * c2 + c2) + (c2 * (h // 8) * (w // 8) * hidden + hidden) \
        + (hidden * n_classes + n_classes)


@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 28, 28), (1, 32, 32), (3, 32, 32), (3, 8, 13)])
def test_cnn_output_shape_and_parameter_count(shape):
    torch.manual_seed(0)
    model = CNN(shape)
    assert model(torch.randn(5, *shape)).shape == (5, 10)
    assert sum(p.numel() for p in model.parameters()) == cnn_parameter_count(*shape)
    assert model.fc1.in_features == 32 * (shape[1] // 8) * (shape[2] // 8)


def test_cnn_default_is_mnist_sized():
    model = CNN()
    assert model.input_shape == (1, 28, 28)
    assert sum(p.numel() for p in model.parameters()) == 43082  # FC1 takes 32 * 3 * 3 values
    other = CNN((3, 32, 32), n_classes=4, channels=(8, 12), hidden=20, dropout=0.5)
    assert other(torch.randn(2, 3, 32, 32)).shape == (2, 4)
    assert sum(p.numel() for p in other.parameters()) == cnn_parameter_count(3, 32, 32, (8, 12), 20, 4)


def test_cnn_layers_in_the_order_of_the_sheet():
    model = CNN()
    names = [name for name, _ in model.named_children()]
    assert names == ["conv1", "pool1", "relu1", "conv2", "pool2", "relu2", "dropout", "pool3",
                     "flatten", "fc1", "relu3", "fc2"]
    kinds = [type(m) for _, m in model.named_children()]
    assert kinds == [nn.Conv2d, nn.MaxPool2d, nn.ReLU, nn.Conv2d, nn.MaxPool2d, nn.ReLU, nn.Dropout,
                     nn.MaxPool2d, nn.Flatten, nn.Linear, nn.ReLU, nn.Linear]
    for conv in (model.conv1, model.conv2):
        assert conv.kernel_size == (3, 3) and conv.padding == (1, 1)
    for pool in (model.pool1, model.pool2, model.pool3):
        assert pool.kernel_size == 2 and pool.stride == 2
    assert model.dropout.p == 0.25 and model.fc1.out_features == 128 and model.fc2.out_features == 10


def test_cnn_forward_applies_the_children_in_order():
    # The listed order is the computed order, and the output is logits (no softmax).
    torch.manual_seed(0)
    model = CNN((3, 32, 32)).eval()
    x = torch.randn(4, 3, 32, 32)
    out = x
    for layer in model.children():
        out = layer(out)
    assert torch.allclose(model(x), out)
    with torch.no_grad():
        model.fc2.weight.mul_(100)
    assert not torch.allclose(model(x).exp().sum(1), torch.ones(4))


def test_cnn_dropout_only_in_train_mode():
    torch.manual_seed(0)
    model = CNN()
    x = torch.randn(8, 1, 28, 28)
    model.eval()
    assert torch.equal(model(x), model(x))
    model.train()
    assert not torch.equal(model(x), model(x))
    # Without dropout, train mode is deterministic too: the randomness was the dropout.
    plain = CNN(dropout=0.0).train()
    assert torch.equal(plain(x), plain(x))


@pytest.mark.parametrize("shape, message", [
    ((28, 28), "must be \\(channels, height, width\\)"),
    ((1, 1, 28, 28), "must be \\(channels, height, width\\)"),
    ("1x28x28", "must be \\(channels, height, width\\)"),
    ((1, 7, 28), "too small.*8 or more"),
    ((3, 32, 4), "too small.*8 or more"),
    ((0, 28, 28), "input channels must be a whole number >= 1"),
    ((1, 28.0, 28), "height must be a whole number >= 1"),
])
def test_cnn_rejects_shapes_it_cannot_take(shape, message):
    with pytest.raises(ValueError, match=message):
        CNN(shape)


def test_cnn_accepts_any_positive_channel_count():
    assert CNN((2, 16, 16))(torch.randn(1, 2, 16, 16)).shape == (1, 10)


@pytest.mark.parametrize("bad, message", [
    (dict(channels=(16,)), "channels must be the output channels of conv1 and conv2"),
    (dict(channels=(16, 0)), "channels\\[1\\] must be"),
    (dict(hidden=0), "hidden must be"),
    (dict(n_classes=0), "n_classes must be"),
    (dict(dropout=1.0), "dropout must be a probability in \\[0, 1\\)"),
])
def test_cnn_rejects_bad_sizes(bad, message):
    with pytest.raises(ValueError, match=message):
        CNN(**bad)


@pytest.mark.parametrize("shape", [(2, 3, 28, 28), (2, 1, 32, 32), (2, 784), (1, 28, 28)])
def test_cnn_forward_names_the_shape_it_was_built_for(shape):
    with pytest.raises(ValueError) as info:
        CNN()(torch.randn(*shape))
    message = str(info.value)
    assert "(1, 28, 28)" in message and str(tuple(shape)) in message
    assert "CNN(input_shape=data.input_shape)" in message


# --- WideResNet ------------------------------------------------------------------------------

def wrn_parameter_count(depth, width, in_channels=3, n_classes=10):
    """Closed form: stem, three stages of n blocks, final BN, linear layer.

    A block from a to b channels has BN(a) + 3x3 conv a->b + BN(b) + 3x3 conv b->b, plus a
    1x1 conv a->b when the shape changes (more channels, or stride 2 in stages 2 and 3).
    BN has 2 parameters per channel; convolutions have no bias.
    """
    n = (depth - 4) // 6
    k = width
    stages = [(16, 16 * k, k != 1), (16 * k, 32 * k, True), (32 * k, 64 * k, True)]
    total = 9 * in_channels * 16
    for a, b, shortcut in stages:
        total += 2 * a + 9 * a * b + 2 * b + 9 * b * b + (a * b if shortcut else 0)
        total += (n - 1) * (4 * b + 18 * b * b)
    return total + 2 * 64 * k + 64 * k * n_classes + n_classes


@pytest.mark.parametrize("depth, width, in_channels, n_classes", [
    (10, 1, 3, 10), (16, 2, 1, 10), (22, 4, 3, 100), (16, 8, 3, 10), (16, 10, 3, 10)])
def test_wrn_parameter_count_matches_formula(depth, width, in_channels, n_classes):
    model = WideResNet(depth, width, n_classes=n_classes, in_channels=in_channels)
    assert sum(p.numel() for p in model.parameters()) == wrn_parameter_count(depth, width, in_channels, n_classes)


def test_wrn_16_10_is_the_nvidia_course_model():
    model = WideResNet()  # WRN-16-10 for CIFAR-10
    assert 17.0e6 < sum(p.numel() for p in model.parameters()) < 17.2e6  # the paper's 17.1 M
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d) and m.kernel_size == (3, 3)]
    assert sorted({m.out_channels for m in convs}) == [16, 160, 320, 640]
    assert len(convs) == 1 + 3 * 2 * 2  # stem + 3 stages x 2 blocks x 2 convs
    assert model.fc.in_features == 640


@pytest.mark.parametrize("in_channels, size", [(1, 28), (3, 28), (1, 32), (3, 32)])
def test_wrn_output_shape(in_channels, size):
    torch.manual_seed(0)
    model = WideResNet(depth=10, width=2, n_classes=7, in_channels=in_channels)
    assert model(torch.randn(3, in_channels, size, size)).shape == (3, 7)


def test_wrn_16_10_forward_on_cifar_and_fashion_mnist_sizes():
    model = WideResNet().eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 32, 32)).shape == (1, 10)
        assert WideResNet(width=4, in_channels=1).eval()(torch.randn(1, 1, 28, 28)).shape == (1, 10)


def test_wrn_shortcut_only_where_the_shape_changes():
    blocks = list(WideResNet(depth=16, width=1).blocks)
    # width 1: stage 1 keeps 16 channels and the resolution; stages 2 and 3 start with stride 2.
    assert [b.shortcut is not None for b in blocks] == [False, False, True, False, True, False]
    assert all(b.shortcut.kernel_size == (1, 1) for b in blocks if b.shortcut is not None)
    assert [b.shortcut is not None for b in WideResNet(depth=10, width=4).blocks] == [True, True, True]


def test_wrn_block_is_pre_activation():
    # BN-ReLU before each conv: a block's output is its input plus the residual branch.
    torch.manual_seed(0)
    block = WideResNet(depth=10, width=1).blocks[0].eval()
    x = torch.randn(2, 16, 8, 8)
    expected = block.conv2(torch.relu(block.bn2(block.conv1(torch.relu(block.bn1(x)))))) + x
    assert torch.allclose(block(x), expected, atol=1e-6)


def test_wrn_kaiming_init_fan_out():
    torch.manual_seed(0)
    model = WideResNet(depth=10, width=4)
    conv = model.blocks[2].conv2  # 256 -> 256, 3x3
    assert conv.weight.std().item() == pytest.approx(math.sqrt(2 / (9 * 256)), rel=0.05)
    assert all(torch.equal(m.weight, torch.ones_like(m.weight)) for m in model.modules()
               if isinstance(m, nn.BatchNorm2d))
    assert torch.equal(model.fc.bias, torch.zeros_like(model.fc.bias))


@pytest.mark.parametrize("depth", [4, 12, 15, 18])
def test_wrn_rejects_depths_that_are_not_6n_plus_4(depth):
    with pytest.raises(ValueError, match=f"6n \\+ 4 .*10, 16, 22, 28.*got {depth}"):
        WideResNet(depth=depth)


@pytest.mark.parametrize("bad, message", [(dict(width=0), "width must be"), (dict(dropout=-0.1), "dropout"),
                                          (dict(in_channels=0), "in_channels must be")])
def test_wrn_rejects_bad_arguments(bad, message):
    with pytest.raises(ValueError, match=message):
        WideResNet(**bad)


def test_wrn_dropout_only_in_train_mode():
    torch.manual_seed(0)
    model = WideResNet(depth=10, width=1, dropout=0.3)
    x = torch.randn(4, 3, 16, 16)
    model.eval()
    assert torch.equal(model(x), model(x))
    model.train()
    assert not torch.equal(model(x), model(x))
