"""What reading batches costs, against training on them. Taught in lab 06 (section 2).

``loader_rates`` times one pass over a training set for each way of reading batches (tensors in
memory, ``DataLoader`` with 0 or some worker processes, with or without a per-sample random shift,
pinned memory where a GPU is present); ``training_rate`` times the model's training step on
batches of the same size; ``print_rates`` prints them side by side with the share of a step spent
loading when loading and training take turns in one process.
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset


class Shifted(Dataset):
    """The images, each moved by a random offset of up to 2 pixels: per-sample work, as augmentation does."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        height, width = self.x.shape[-2:]
        padded = F.pad(self.x[i], (2, 2, 2, 2))
        dy, dx = torch.randint(0, 5, (2,)).tolist()
        return padded[:, dy:dy + height, dx:dx + width], self.y[i]


class InMemory:
    """Batches by indexing the whole tensors with a shuffled index (what the earlier labs do)."""

    def __init__(self, x, y, batch: int):
        self.x, self.y, self.batch = x, y, batch

    def __iter__(self):
        for index in torch.randperm(len(self.x)).split(self.batch):
            yield self.x[index], self.y[index]


def images_per_s(make, n: int, passes: int = 3) -> tuple[float, float]:
    """Images per second of the fastest of ``passes`` passes over the loader ``make()`` returns, and of its
    first pass (which includes starting worker processes: persistent_workers keeps them for the later passes)."""
    batches, seconds = make(), []
    for _ in range(passes):
        start = time.perf_counter()
        for _ in batches:
            pass
        seconds.append(time.perf_counter() - start)
    return n / min(seconds), n / seconds[0]


def loader_rates(x, y, batch: int, workers: int) -> dict:
    """``{way: (images/s of the best pass, images/s of the first pass)}`` for each way of reading (x, y)."""
    plain = TensorDataset(x, y)
    ways = {
        "tensors in memory, indexed": lambda: InMemory(x, y, batch),
        "DataLoader, 0 workers": lambda: DataLoader(plain, batch, shuffle=True),
        f"DataLoader, {workers} workers": lambda: DataLoader(plain, batch, shuffle=True, num_workers=workers,
                                                             persistent_workers=True),
        "shifted, DataLoader, 0 workers": lambda: DataLoader(Shifted(x, y), batch, shuffle=True),
        f"shifted, DataLoader, {workers} workers": lambda: DataLoader(Shifted(x, y), batch, shuffle=True,
                                                                      num_workers=workers, persistent_workers=True),
    }
    if torch.cuda.is_available():
        ways["DataLoader, 0 workers, pin_memory"] = lambda: DataLoader(plain, batch, shuffle=True, pin_memory=True)
    return {name: images_per_s(make, len(x)) for name, make in ways.items()}


def training_rate(model, x, y, steps: int, warmup: int = 3) -> float:
    """Images per second of ``model``'s SGD training step on the batch (x, y), after ``warmup`` steps."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(warmup + steps):
        if i == warmup:
            start = time.perf_counter()
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    return steps * len(x) / (time.perf_counter() - start)


def print_rates(measured: dict, training: float, batch: int) -> None:
    """The table of ``loader_rates`` beside the training rate, with the share of a step spent loading."""
    print(f"{'way of reading batches of ' + str(batch):<40} {'images/s':>10} {'first pass':>11} "
          f"{'share of a step spent loading':>30}")
    for name, (rate, first) in measured.items():
        print(f"{name:<40} {rate:>10,.0f} {first:>11,.0f} {training / (training + rate):>30.0%}")
    print(f"{'the CNN training on batches of ' + str(batch) + f' ({torch.get_num_threads()} threads)':<40} "
          f"{training:>10,.0f}")
