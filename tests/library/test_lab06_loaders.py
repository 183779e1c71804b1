"""utils.labs.lab06 (lab 06, section 2): the ways of reading batches that the lab times."""
from __future__ import annotations

import torch

from utils import models
from utils.labs import lab06


def test_shifted_images_keep_their_shape_and_label_and_move_at_most_two_pixels():
    x = torch.zeros(3, 1, 8, 8)
    x[:, :, 4, 4] = 1.0
    shifted = lab06.Shifted(x, torch.tensor([5, 6, 7]))
    for i in range(3):
        image, label = shifted[i]
        assert image.shape == (1, 8, 8) and label == 5 + i
        row, col = (image[0] == 1).nonzero()[0].tolist()
        assert abs(row - 4) <= 2 and abs(col - 4) <= 2


def test_in_memory_batches_cover_every_sample_once():
    x, y = torch.arange(10.0).reshape(10, 1), torch.arange(10)
    seen = torch.cat([yb for _, yb in lab06.InMemory(x, y, batch=4)])
    assert sorted(seen.tolist()) == list(range(10))


def test_rates_are_measured_and_printed(capsys):
    x, y = torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,))
    best, first = lab06.images_per_s(lambda: lab06.InMemory(x, y, 4), len(x), passes=2)
    assert best >= first > 0
    training = lab06.training_rate(models.CNN((1, 8, 8)), x[:4], y[:4], steps=2, warmup=1)
    lab06.print_rates({"tensors in memory, indexed": (best, first)}, training, 4)
    out = capsys.readouterr().out
    assert "tensors in memory, indexed" in out and "the CNN training on batches of 4" in out
