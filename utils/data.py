"""Datasets for the labs, all returned as in-memory tensors with a held-out test split.

Offline sets (no network ever): ``synthetic`` (the seed exercise's ``make_classification``
problem), ``mnist1d`` (Greydanus, 2020: procedural 1-D digits), ``digits`` (scikit-learn's
bundled 8x8 digits). Image sets through torchvision: ``mnist``, ``fashion-mnist``,
``cifar10``; they are read from ``utils.config.data_dir()`` and downloaded there when
allowed and online.
"""
from __future__ import annotations

import pickle
import socket
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from . import config

OFFLINE_DATASETS = ("synthetic", "mnist1d", "digits")
IMAGE_DATASETS = ("mnist", "fashion-mnist", "cifar10")
DATASETS = OFFLINE_DATASETS + IMAGE_DATASETS


class DatasetNotFound(FileNotFoundError):
    """The files of a torchvision dataset are not on disk and could not be downloaded."""


@dataclass
class Dataset:
    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    n_classes: int

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    @property
    def n_features(self) -> int:
        return int(np.prod(self.input_shape))

    def __repr__(self) -> str:
        return (f"Dataset({self.name!r}: {len(self.x_train)} train / {len(self.x_test)} test samples, "
                f"input {self.input_shape}, {self.n_classes} classes)")


def synthetic(train_size: int = 10000, test_size: int = 2000, d_in: int = 1024,
              n_classes: int = 32, seed: int = 0) -> Dataset:
    """The seed exercise's classification problem, with a real held-out test split.

    One ``make_classification`` call draws train and test samples from the same
    clusters; the first ``train_size`` samples train, the rest test.
    """
    from sklearn.datasets import make_classification

    if train_size < 1 or test_size < 1:
        raise ValueError(f"train_size and test_size must be >= 1, got {train_size} and {test_size}")
    x, y = make_classification(n_samples=train_size + test_size, n_features=d_in,
                               n_informative=d_in // 2, n_classes=n_classes,
                               n_clusters_per_class=10, random_state=seed)
    x = torch.from_numpy(x.astype(np.float32))
    y = torch.from_numpy(y).long()
    return Dataset("synthetic", x[:train_size], y[:train_size], x[train_size:], y[train_size:], n_classes)


def mnist1d(num_samples: int = 5000, seed: int = 42) -> Dataset:
    """MNIST-1D (Greydanus, 2020): 40-sample 1-D signals of the ten digits, 80/20 split."""
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples, args.seed = num_samples, seed
    d = make_dataset(args)
    as_x = lambda a: torch.from_numpy(np.asarray(a, dtype=np.float32))
    as_y = lambda a: torch.from_numpy(np.asarray(a)).long()
    return Dataset("mnist1d", as_x(d["x"]), as_y(d["y"]), as_x(d["x_test"]), as_y(d["y_test"]), 10)


def digits(test_fraction: float = 0.2, seed: int = 0) -> Dataset:
    """scikit-learn's bundled 8x8 digits (1797 images), pixels scaled to [0, 1]."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x_tr, x_te, y_tr, y_te = train_test_split(d.images / 16.0, d.target, test_size=test_fraction,
                                              random_state=seed, stratify=d.target)
    t = lambda a: torch.from_numpy(a.astype(np.float32)).unsqueeze(1)
    return Dataset("digits", t(x_tr), torch.from_numpy(y_tr).long(), t(x_te), torch.from_numpy(y_te).long(), 10)


# --- torchvision image sets ------------------------------------------------------------

_FILES = {
    "mnist": ("MNIST/raw", ["train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                            "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]),
    "fashion-mnist": ("FashionMNIST/raw", ["train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                           "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]),
    "cifar10": ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]),
}


def _missing_files(name: str, root: Path) -> list[Path]:
    folder, files = _FILES[name]
    return [root / folder / f for f in files if not (root / folder / f).exists()]


def _download(name: str, root: Path) -> None:
    from torchvision import datasets

    cls = {"mnist": datasets.MNIST, "fashion-mnist": datasets.FashionMNIST, "cifar10": datasets.CIFAR10}[name]
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(30)  # an offline machine must fail fast, not hang
    try:
        for train in (True, False):
            cls(str(root), train=train, download=True)
    finally:
        socket.setdefaulttimeout(previous)


def _read_idx_pair(raw: Path, prefix: str) -> tuple[torch.Tensor, torch.Tensor]:
    from torchvision.datasets.mnist import read_image_file, read_label_file

    return read_image_file(str(raw / f"{prefix}-images-idx3-ubyte")), read_label_file(str(raw / f"{prefix}-labels-idx1-ubyte"))


def _read_cifar_batches(paths: list[Path]) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = [], []
    for path in paths:
        with open(path, "rb") as f:
            batch = pickle.load(f, encoding="latin1")
        xs.append(np.asarray(batch["data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
        ys.append(np.asarray(batch["labels"]))
    return torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys)).long()


def torchvision_dataset(name: str, root: Path | str | None = None, download: bool | None = None) -> Dataset:
    """MNIST, Fashion-MNIST or CIFAR-10 from ``root`` in torchvision's on-disk layout.

    Pixels are scaled to [0, 1] and standardised with the training set's mean and std
    (per channel). Missing files are downloaded when ``download`` (default: the
    ``COURSE_DOWNLOAD`` setting) allows; otherwise ``DatasetNotFound`` says where to put them.
    """
    if name not in IMAGE_DATASETS:
        raise ValueError(f"unknown image dataset {name!r}; choose one of {', '.join(IMAGE_DATASETS)}")
    root = Path(root) if root is not None else config.data_dir()
    download = config.download_allowed() if download is None else download
    if _missing_files(name, root) and download:
        try:
            _download(name, root)
        except Exception as error:  # no network, a mirror down, a partial file...
            reason = f"downloading failed ({type(error).__name__}: {error})"
        else:
            reason = ""
    else:
        reason = "downloading is switched off (download=False or COURSE_DOWNLOAD=0)" if not download else ""
    missing = _missing_files(name, root)
    if missing:
        folder = root / _FILES[name][0]
        raise DatasetNotFound(
            f"{name}: {len(missing)} file(s) missing in {folder}: {', '.join(p.name for p in missing)}"
            f"{'; ' + reason if reason else ''}. Run once on a machine with network access (COURSE_DOWNLOAD=1, the default), "
            f"or copy torchvision's files for {name} into {folder}, or point COURSE_DATA_DIR at a "
            f"folder that has them, or use an offline dataset: {', '.join(OFFLINE_DATASETS)}.")
    folder = root / _FILES[name][0]
    if name == "cifar10":
        x_train, y_train = _read_cifar_batches([folder / f"data_batch_{i}" for i in range(1, 6)])
        x_test, y_test = _read_cifar_batches([folder / "test_batch"])
    else:
        x_train, y_train = _read_idx_pair(folder, "train")
        x_test, y_test = _read_idx_pair(folder, "t10k")
        x_train, x_test = x_train.unsqueeze(1), x_test.unsqueeze(1)
    x_train, x_test = x_train.float() / 255.0, x_test.float() / 255.0
    mean = x_train.mean(dim=(0, 2, 3), keepdim=True)
    std = x_train.std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)
    return Dataset(name, (x_train - mean) / std, y_train, (x_test - mean) / std, y_test, 10)


def load(name: str | None = None, train_size: int | None = None, test_size: int | None = None,
         **options) -> Dataset:
    """Load a dataset by name (default: the ``COURSE_DATASET`` setting), optionally subsampled.

    ``train_size``/``test_size`` keep the first samples of each split (quick mode uses
    this); ``options`` go to the dataset's own function (e.g. ``d_in`` for synthetic).
    """
    name = (name or config.dataset_name()).strip().lower()
    if name == "synthetic":
        data = synthetic(**({"train_size": train_size} if train_size else {}),
                         **({"test_size": test_size} if test_size else {}), **options)
    elif name == "mnist1d":
        data = mnist1d(**options)
    elif name == "digits":
        data = digits(**options)
    elif name in IMAGE_DATASETS:
        data = torchvision_dataset(name, **options)
    else:
        raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    for label, size, available in (("train_size", train_size, len(data.x_train)),
                                   ("test_size", test_size, len(data.x_test))):
        if size is not None and not 1 <= size <= available:
            raise ValueError(f"{label}={size} but {name} has {available} samples in that split; "
                             f"choose a size between 1 and {available}")
    if train_size:
        data.x_train, data.y_train = data.x_train[:train_size], data.y_train[:train_size]
    if test_size:
        data.x_test, data.y_test = data.x_test[:test_size], data.y_test[:test_size]
    return data
