"""Datasets: built-in (scikit-learn digits, synthetic) or MNIST/FashionMNIST from local IDX files.

Nothing is downloaded: built-in sets ship with scikit-learn; MNIST-like sets are read from the
folder ``data.root``. Every loader returns float32 inputs and int64 labels, then the same label
selection (``classes`` / ``positive_classes``) and deterministic subsampling are applied.
"""

from __future__ import annotations

import gzip
import math
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

from wirelessfl.errors import UserError
from wirelessfl.learning.seeds import keyed_rng

IDX_IMAGES_MAGIC = 2051  # 0x00000803: unsigned bytes, 3 dimensions (count, rows, cols)
IDX_LABELS_MAGIC = 2049  # 0x00000801: unsigned bytes, 1 dimension (count)
IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
_IDX_TITLES = {"mnist": "MNIST", "fashionmnist": "FashionMNIST"}


class SyntheticConfig(BaseModel):
    """sklearn ``make_classification`` settings (features standardised after generation)."""

    model_config = ConfigDict(extra="forbid")

    num_samples: int = Field(2000, ge=8, description="samples before the train/test split")
    num_features: int = Field(20, ge=2, description="input dimension")
    num_classes: int = Field(2, ge=2, description="number of labels")
    class_sep: float = Field(1.0, gt=0, description="larger values make the task easier")
    informative: int | None = Field(
        None, ge=1, description="informative features (default: max(2, ceil(log2 classes) + 1))")

    @model_validator(mode="after")
    def _feasible(self):
        k = self.n_informative
        if k > self.num_features:
            raise ValueError(f"synthetic.informative={k} exceeds num_features={self.num_features}; "
                             "lower informative or raise num_features")
        if 2**k < 2 * self.num_classes:
            raise ValueError(f"synthetic.informative={k} is too few for {self.num_classes} classes "
                             f"(need 2^informative >= 2 * num_classes); raise informative")
        return self

    @property
    def n_informative(self) -> int:
        return self.informative or max(2, math.ceil(math.log2(self.num_classes)) + 1)


class DataConfig(BaseModel):
    """Which dataset, which labels, how much of it (scenario key ``data``)."""

    model_config = ConfigDict(extra="forbid")

    name: Literal["digits", "digits28", "synthetic", "mnist", "fashionmnist"] = Field(
        "digits", description="digits: sklearn 8x8 flat; digits28: the same upscaled to 1x28x28; "
                              "synthetic: make_classification; mnist/fashionmnist: IDX files in root")
    root: str | None = Field(None, description="folder with the four IDX files (mnist, fashionmnist)")
    classes: list[int] | None = Field(
        None, description="keep only these labels, relabelled 0..k-1 in this order "
                          "(e.g. FashionMNIST [6, 7]: shirt vs sneaker, seed 002 Sec. V)")
    positive_classes: list[int] | None = Field(
        None, description="binary task: label 1 for these original labels, 0 for all others")
    test_fraction: float = Field(
        0.25, gt=0, lt=1, description="test share for sets without a test split (stratified)")
    max_train_samples: PositiveInt | None = Field(None, description="subsample the training set")
    server_fraction: float = Field(
        0.0, ge=0, lt=1, description="share of the training set the base station keeps for its "
                                     "own loss (seed 000's server data: 0.3); never on devices")
    max_test_samples: PositiveInt | None = Field(None, description="subsample the test set")
    synthetic: SyntheticConfig = SyntheticConfig()

    @model_validator(mode="after")
    def _labels(self):
        if self.classes is not None and self.positive_classes is not None:
            raise ValueError("set either data.classes or data.positive_classes, not both")
        if self.classes is not None and len(self.classes) < 2:
            raise ValueError(f"data.classes={self.classes} keeps fewer than 2 labels; "
                             "list at least two labels (e.g. [6, 7])")
        for key in ("classes", "positive_classes"):
            labels = getattr(self, key)
            if labels is None:
                continue
            if not labels:
                raise ValueError(f"data.{key} is empty; list at least one label or remove it")
            if len(set(labels)) != len(labels):
                raise ValueError(f"data.{key}={labels} repeats a label; list each label once")
            if min(labels) < 0:
                raise ValueError(f"data.{key}={labels} has a negative label; labels start at 0")
        return self


@dataclass
class Dataset:
    """Arrays ready for the evaluator: x float32 [n, *input_shape], y int64 [n]."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    input_shape: tuple[int, ...]


def load_dataset(config: DataConfig, seed: int) -> Dataset:
    """Load ``config.name``, select labels, subsample; deterministic for a given ``seed``."""
    if config.name in ("digits", "digits28"):
        x, y, num_classes = _digits(upscale=config.name == "digits28")
        x_train, x_test, y_train, y_test = _split(x, y, config.test_fraction, seed)
    elif config.name == "synthetic":
        x, y, num_classes = _synthetic(config.synthetic, seed)
        x_train, x_test, y_train, y_test = _split(x, y, config.test_fraction, seed)
        mean, std = x_train.mean(0), x_train.std(0) + 1e-8  # train statistics only
        x_train, x_test = (x_train - mean) / std, (x_test - mean) / std
    else:
        x_train, y_train, x_test, y_test = read_idx_dataset(config.root, config.name)
        num_classes = 10

    if config.classes is not None:
        _check_present(config.classes, y_train, "classes", config.name)
        x_train, y_train = _select(x_train, y_train, config.classes)
        x_test, y_test = _select(x_test, y_test, config.classes)
        num_classes = len(config.classes)
    elif config.positive_classes is not None:
        _check_present(config.positive_classes, y_train, "positive_classes", config.name)
        if set(np.unique(y_train).tolist()) <= set(config.positive_classes):
            raise UserError(f"data.positive_classes={config.positive_classes} covers every label of "
                            f"'{config.name}', leaving no negative class; list fewer labels")
        y_train = np.isin(y_train, config.positive_classes).astype(np.int64)
        y_test = np.isin(y_test, config.positive_classes).astype(np.int64)
        num_classes = 2

    x_train, y_train = _subsample(x_train, y_train, config.max_train_samples, seed, "train")
    x_test, y_test = _subsample(x_test, y_test, config.max_test_samples, seed, "test")
    return Dataset(config.name, np.ascontiguousarray(x_train, np.float32), y_train.astype(np.int64),
                   np.ascontiguousarray(x_test, np.float32), y_test.astype(np.int64),
                   num_classes, tuple(x_train.shape[1:]))


def _digits(upscale: bool) -> tuple[np.ndarray, np.ndarray, int]:
    """sklearn's 8x8 digits in [0, 1]: flat [n, 64], or bilinearly upscaled to [n, 1, 28, 28]."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = bunch.images.astype(np.float32) / 16.0
    if not upscale:
        return images.reshape(len(images), -1), bunch.target.astype(np.int64), 10
    # align_corners=False keeps the mean intensity of each image (3.5x zoom of pixel areas).
    big = F.interpolate(torch.from_numpy(images)[:, None], size=(28, 28), mode="bilinear",
                        align_corners=False)
    return big.clamp(0, 1).numpy(), bunch.target.astype(np.int64), 10


def _synthetic(cfg: SyntheticConfig, seed: int) -> tuple[np.ndarray, np.ndarray, int]:
    from sklearn.datasets import make_classification

    k = cfg.n_informative
    x, y = make_classification(
        n_samples=cfg.num_samples, n_features=cfg.num_features, n_informative=k,
        n_redundant=min(2, cfg.num_features - k), n_repeated=0, n_classes=cfg.num_classes,
        class_sep=cfg.class_sep, random_state=seed % 2**32)
    return x.astype(np.float32), y.astype(np.int64), cfg.num_classes


def _split(x: np.ndarray, y: np.ndarray, test_fraction: float, seed: int):
    """Stratified train/test split (x_train, x_test, y_train, y_test), fixed by ``seed``."""
    from sklearn.model_selection import train_test_split

    try:
        return train_test_split(x, y, test_size=test_fraction, stratify=y,
                                random_state=seed % 2**32)
    except ValueError as exc:
        raise UserError(f"data.test_fraction={test_fraction} cannot split {len(y)} samples with "
                        f"stratification ({exc}); use a fraction nearer 0.25 or more samples") from exc


def _check_present(labels: list[int], y: np.ndarray, key: str, name: str) -> None:
    present = np.unique(y).tolist()
    missing = [c for c in labels if c not in present]
    if missing:
        raise UserError(f"data.{key} lists label(s) {missing} that dataset '{name}' does not have; "
                        f"its labels are {present}")


def _select(x: np.ndarray, y: np.ndarray, classes: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Keep samples whose label is in ``classes``, relabelled by position in that list."""
    lookup = np.full(max(int(y.max()), max(classes)) + 1, -1, np.int64)
    lookup[classes] = np.arange(len(classes))
    new = lookup[y]
    keep = new >= 0
    return x[keep], new[keep]


def _subsample(x, y, limit: int | None, seed: int, part: str):
    """At most ``limit`` samples, chosen by a keyed generator, kept in their original order."""
    if limit is None or limit >= len(y):
        return x, y
    idx = np.sort(keyed_rng(seed, f"data-subsample-{part}").choice(len(y), limit, replace=False))
    return x[idx], y[idx]


# --- IDX files (MNIST format: http://yann.lecun.com/exdb/mnist/, "FILE FORMATS") -------------


def read_idx_dataset(root: str | None, name: str):
    """(x_train, y_train, x_test, y_test) from the four IDX files in ``root``, pixels / 255."""
    title = _IDX_TITLES.get(name, name)
    wanted = ", ".join(f"{f}.gz" for f in IDX_FILES)
    if root is None:
        raise UserError(f"dataset '{name}' needs data.root: set it to a folder holding the four "
                        f"{title} IDX files ({wanted})")
    folder = Path(root).expanduser()
    if not folder.is_dir():
        raise UserError(f"data.root folder {folder} does not exist: put the four {title} IDX files "
                        f"({wanted}) there, or fix data.root")
    paths = {f: _find(folder, f) for f in IDX_FILES}
    missing = [f for f, p in paths.items() if p is None]
    if missing:
        raise UserError(f"data.root folder {folder} lacks {', '.join(missing)} (plain or .gz): put "
                        f"the four {title} IDX files ({wanted}) in {folder}, or set data.root")
    arrays = []
    for split in ("train", "t10k"):
        images = read_idx(paths[f"{split}-images-idx3-ubyte"], IDX_IMAGES_MAGIC)
        labels = read_idx(paths[f"{split}-labels-idx1-ubyte"], IDX_LABELS_MAGIC)
        if len(images) != len(labels):
            raise UserError(f"{paths[f'{split}-images-idx3-ubyte']} has {len(images)} images but "
                            f"{paths[f'{split}-labels-idx1-ubyte']} has {len(labels)} labels; "
                            "replace them with a matching pair")
        arrays += [images[:, None].astype(np.float32) / 255.0, labels.astype(np.int64)]
    if arrays[0].shape[1:] != arrays[2].shape[1:]:
        raise UserError(f"{title} train images are {arrays[0].shape[2:]} pixels but test images are "
                        f"{arrays[2].shape[2:]}; in {folder}, use files from the same dataset")
    return tuple(arrays)


def _find(folder: Path, base: str) -> Path | None:
    for candidate in (folder / base, folder / f"{base}.gz"):
        if candidate.is_file():
            return candidate
    return None


def read_idx(path: Path, magic: int) -> np.ndarray:
    """A uint8 IDX array: images [n, rows, cols] (magic 2051) or labels [n] (magic 2049)."""
    ndim = 3 if magic == IDX_IMAGES_MAGIC else 1
    kind = "image" if ndim == 3 else "label"
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, zlib.error) as exc:
        raise UserError(f"{path} cannot be read ({exc}); replace it with the original IDX file") \
            from exc
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise UserError(f"{path} is too short for an IDX {kind} file ({len(raw)} bytes); "
                        "replace it with the original file")
    found, *dims = struct.unpack(f">{1 + ndim}i", raw[:header])
    if found != magic:
        raise UserError(f"{path} is not an IDX {kind} file (magic number {found}, expected {magic}); "
                        "replace it with the original file")
    if len(raw) != header + math.prod(dims):
        raise UserError(f"{path} should hold {header + math.prod(dims)} bytes for shape {dims} but "
                        f"holds {len(raw)} (truncated or corrupt); replace it with the original file")
    return np.frombuffer(raw, np.uint8, offset=header).reshape(dims)
