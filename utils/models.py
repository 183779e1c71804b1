"""Models used by the labs.

``MLP`` is the multi-layer perceptron of lab 01 (taught there, cell by cell); ``CNN`` (seed
003's network) and ``WideResNet`` are the realistic models of lab 06.
"""
from __future__ import annotations

import numbers

import torch
from torch import nn


def mlp_layer_shapes(n_layers: int, d_in: int, d_hidden: int, n_classes: int) -> list[tuple[int, int]]:
    """(in_features, out_features) of each linear layer: d_in -> d_hidden ... -> n_classes."""
    sizes = {"n_layers": n_layers, "d_in": d_in, "d_hidden": d_hidden, "n_classes": n_classes}
    for name, value in sizes.items():
        # numbers.Integral admits numpy integers (e.g. from np.prod); bool is not a size.
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    n_layers, d_in, d_hidden, n_classes = (int(v) for v in sizes.values())
    widths = [d_in] + [d_hidden] * (n_layers - 1) + [n_classes]
    return list(zip(widths[:-1], widths[1:]))


class MLP(nn.Module):
    """Bias-free linear layers with tanh between them (not after the last one).

    Weights use Kaiming-uniform initialisation (He et al., 2015), as in the seed
    exercise this lab is built on. Taught in labs/01_mlp_cpu.ipynb.
    """

    def __init__(self, n_layers: int = 4, d_in: int = 1024, d_hidden: int = 256, n_classes: int = 32):
        super().__init__()
        self.layers = nn.ModuleList()
        for fan_in, fan_out in mlp_layer_shapes(n_layers, d_in, d_hidden, n_classes):
            layer = nn.Linear(fan_in, fan_out, bias=False)
            nn.init.kaiming_uniform_(layer.weight)
            self.layers.append(layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x.flatten(1)
        for layer in self.layers[:-1]:
            out = torch.tanh(layer(out))
        return self.layers[-1](out)


def _whole(name: str, value, minimum: int = 1) -> int:
    """``value`` as an int, or a ValueError naming the argument (numpy integers accepted)."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be a whole number >= {minimum}, got {value!r}")
    return int(value)


def _check_dropout(dropout) -> float:
    if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real) or not 0 <= dropout < 1:
        raise ValueError(f"dropout must be a probability in [0, 1), got {dropout!r}")
    return float(dropout)


class CNN(nn.Module):
    """Seed 003's convolutional network, layer for layer as its exercise sheet lists it.

    conv1 (3x3) -> pool1 (max 2x2) -> ReLU -> conv2 (3x3) -> pool2 -> ReLU -> dropout
    -> pool3 -> flatten -> FC1 -> ReLU -> FC2. The sheet ends with a softmax layer; here
    ``forward`` returns the logits and the softmax lives inside ``F.cross_entropy``, which
    computes log-softmax and the loss in one numerically stable step (take
    ``logits.softmax(1)`` when you want the probabilities).

    ``input_shape`` is (channels, height, width): 1 (grey) or 3 (colour) channels, or any
    other positive count; height and width 8 or more, because the three 2x2 poolings each
    halve them (rounding down) and FC1 needs at least one pixel left. FC1's input size is
    computed from the shape, so 28x28 (MNIST) and 32x32 (CIFAR-10) both work. The
    convolutions pad by 1, so only the poolings change the size.
    Used from lab 06 on.
    """

    def __init__(self, input_shape=(1, 28, 28), n_classes: int = 10, channels=(16, 32),
                 hidden: int = 128, dropout: float = 0.25):
        super().__init__()
        if isinstance(input_shape, (str, bytes)) or not hasattr(input_shape, "__len__") or len(input_shape) != 3:
            raise ValueError(f"input_shape must be (channels, height, width), e.g. (1, 28, 28) or (3, 32, 32); "
                             f"got {input_shape!r}")
        c, h, w = (_whole(name, v) for name, v in zip(("input channels", "height", "width"), input_shape))
        if h < 8 or w < 8:
            raise ValueError(f"input_shape {tuple(input_shape)!r} is too small: the three 2x2 max poolings "
                             f"halve height and width three times, so both must be 8 or more "
                             f"(e.g. (1, 28, 28) or (3, 32, 32))")
        if isinstance(channels, (str, bytes)) or not hasattr(channels, "__len__") or len(channels) != 2:
            raise ValueError(f"channels must be the output channels of conv1 and conv2, e.g. (16, 32); got {channels!r}")
        c1, c2 = (_whole(f"channels[{i}]", v) for i, v in enumerate(channels))
        hidden, n_classes = _whole("hidden", hidden), _whole("n_classes", n_classes)
        self.input_shape = (c, h, w)
        # Each pooling floors: 28 -> 14 -> 7 -> 3, so FC1 sees 32 * 3 * 3 values at 28x28.
        flat = c2 * (h // 8) * (w // 8)
        self.conv1 = nn.Conv2d(c, c1, kernel_size=3, padding=1)
        self.pool1 = nn.MaxPool2d(2)
        # ReLU after max pooling gives the same values as before it (both are monotone),
        # on a quarter of the pixels: the sheet's order is also the cheaper one.
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(c1, c2, kernel_size=3, padding=1)
        self.pool2 = nn.MaxPool2d(2)
        self.relu2 = nn.ReLU()
        self.dropout = nn.Dropout(_check_dropout(dropout))  # zeroes activations in train() mode only
        self.pool3 = nn.MaxPool2d(2)
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(flat, hidden)
        self.relu3 = nn.ReLU()
        self.fc2 = nn.Linear(hidden, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or tuple(x.shape[1:]) != self.input_shape:
            # Without this, a wrong size fails deep inside FC1 with a matrix-shape message.
            raise ValueError(f"CNN was built for images of shape {self.input_shape} (channels, height, width) "
                             f"and expects a batch (batch, {', '.join(map(str, self.input_shape))}); got "
                             f"{tuple(x.shape)}. Build it with CNN(input_shape=data.input_shape) for this data.")
        x = self.relu1(self.pool1(self.conv1(x)))
        x = self.relu2(self.pool2(self.conv2(x)))
        x = self.pool3(self.dropout(x))
        x = self.relu3(self.fc1(self.flatten(x)))
        return self.fc2(x)


# --- WideResNet (Zagoruyko & Komodakis, 2016) -------------------------------------------

def wide_resnet_widths(width: int) -> tuple[int, int, int, int]:
    """Channels of the stem and the three stages: 16, 16k, 32k, 64k (k = the widening factor)."""
    return 16, 16 * width, 32 * width, 64 * width


class WideBlock(nn.Module):
    """Pre-activation basic block: BN-ReLU-conv3x3, BN-ReLU-(dropout)-conv3x3, plus a shortcut.

    When the block changes the number of channels or the resolution, the shortcut is a
    1x1 convolution of the pre-activated input (as in the paper's code); otherwise the
    input itself.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int, dropout: float):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.shortcut = None
        if in_channels != out_channels or stride != 1:
            self.shortcut = nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        o = torch.relu(self.bn1(x))
        y = self.conv1(o)
        y = self.conv2(self.dropout(torch.relu(self.bn2(y))))
        return y + (x if self.shortcut is None else self.shortcut(o))


class WideResNet(nn.Module):
    """WRN-depth-width (Zagoruyko & Komodakis, 2016, "Wide Residual Networks").

    A 3x3 stem convolution to 16 channels, three stages of n = (depth - 4) / 6 pre-activation
    basic blocks with 16k, 32k and 64k channels (k = ``width``; the second and third stages
    halve the resolution), then BN-ReLU, global average pooling and a linear layer.
    WRN-16-10 (the default; stages 16/160/320/640) has about 17.1 M parameters on CIFAR-10.
    Global average pooling makes it work on 28x28 (Fashion-MNIST) and 32x32 (CIFAR-10) alike.
    ``dropout`` is applied between the two convolutions of each block (the paper uses 0.3).
    Used in lab 06.
    """

    def __init__(self, depth: int = 16, width: int = 10, n_classes: int = 10, in_channels: int = 3,
                 dropout: float = 0.0):
        super().__init__()
        depth, width = _whole("depth", depth), _whole("width", width)
        if (depth - 4) % 6 != 0 or depth < 10:
            raise ValueError(f"depth must be 6n + 4 with n >= 1 blocks per stage (10, 16, 22, 28, 34, 40, ...), "
                             f"got {depth}")
        n = (depth - 4) // 6
        dropout = _check_dropout(dropout)
        stem, *stages = wide_resnet_widths(width)
        self.conv = nn.Conv2d(_whole("in_channels", in_channels), stem, 3, padding=1, bias=False)
        blocks, channels = [], stem
        for stage, (out_channels, stride) in enumerate(zip(stages, (1, 2, 2))):
            for i in range(n):
                blocks.append(WideBlock(channels, out_channels, stride if i == 0 else 1, dropout))
                channels = out_channels
        self.blocks = nn.Sequential(*blocks)
        self.bn = nn.BatchNorm2d(channels)
        self.fc = nn.Linear(channels, _whole("n_classes", n_classes))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                # He et al. (2015) with fan-out, as the paper's code (MSRinit: std sqrt(2 / (k*k*out))).
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.zeros_(self.fc.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.conv(x))
        x = torch.relu(self.bn(x))
        return self.fc(x.mean(dim=(2, 3)))  # global average pooling: any input size
