"""Datasets: built-in (scikit-learn digits, breast cancer, synthetic), MNIST/FashionMNIST from
local IDX files, CIFAR-10 from its binary batch files, or any LIBSVM-format file.

Nothing is downloaded: built-in sets ship with scikit-learn; MNIST-like sets, CIFAR-10 and LIBSVM
files are read from the folder ``data.root``. Every loader returns float32 inputs and int64
labels, then the same label selection (``classes`` / ``positive_classes``) and deterministic
subsampling are applied.
"""

from __future__ import annotations

import gzip
import math
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    field_validator,
    model_serializer,
    model_validator,
)

from wirelessfl.errors import UserError
from wirelessfl.learning.seeds import keyed_rng
from wirelessfl.plugins import DATASETS, drop_empty_options, name_validator, options_field

IDX_IMAGES_MAGIC = 2051  # 0x00000803: unsigned bytes, 3 dimensions (count, rows, cols)
IDX_LABELS_MAGIC = 2049  # 0x00000801: unsigned bytes, 1 dimension (count)
IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
_IDX_TITLES = {"mnist": "MNIST", "fashionmnist": "FashionMNIST"}
# Where a distribution package installs an IDX set, read when data.root is not given:
# name -> (folder, Debian package). Debian's dataset-fashion-mnist puts the four gzipped files in
# /usr/share/datasets/fashion-mnist (its file list).
DISTRIBUTION_ROOTS = {"fashionmnist": ("/usr/share/datasets/fashion-mnist", "dataset-fashion-mnist")}
LIBSVM_URL = "https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/binary.html"
# A LIBSVM set is held dense (float32): refuse one larger than this rather than exhaust memory.
LIBSVM_MAX_DENSE_BYTES = 8 * 2**30
# Classes of the built-in sets (a LIBSVM file's are known only once it is read).
# The built-in sets (DataConfig's own; plugins are found in plugins.DATASETS), one line each.
BUILTIN_DATASETS = {
    "digits": "scikit-learn's 8x8 digits, 1797 x 64, 10 classes",
    "digits28": "the digits upscaled to 1x28x28",
    "synthetic": "scikit-learn make_classification (data.synthetic)",
    "mnist": "MNIST from the four IDX files in data.root",
    "fashionmnist": "FashionMNIST from the four IDX files in data.root (default: where Debian's "
                    "dataset-fashion-mnist puts them)",
    "cifar10": "CIFAR-10 from the six binary batch files (cifar-10-batches-bin) in data.root",
    "breast_cancer": "scikit-learn's breast cancer set, 569 x 30, 2 classes",
    "libsvm": "a LIBSVM-format file in data.root (data.file)",
}
BUILTIN_CLASSES = {"digits": 10, "digits28": 10, "mnist": 10, "fashionmnist": 10,
                   "cifar10": 10, "breast_cancer": 2}


class SyntheticConfig(BaseModel):
    """sklearn ``make_classification`` settings (features standardised after generation)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

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

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(
        "digits", description="digits: sklearn 8x8 flat; digits28: the same upscaled to 1x28x28; "
                              "synthetic: make_classification; mnist/fashionmnist: IDX files in "
                              "root; cifar10: the binary batch files in root (never the pickled "
                              "Python version); breast_cancer: sklearn's 569 x 30 binary set "
                              "(standardised); libsvm: a LIBSVM-format file in root "
                              "(data.file); or a dataset plugin's name or 'module:attribute' "
                              "reference (docs/plugins.md)")
    root: str | None = Field(None, description="folder with the four IDX files (mnist, "
                                               "fashionmnist), cifar-10-batches-bin or the folder "
                                               "holding it (cifar10) or the LIBSVM file(s) "
                                               "(libsvm)")
    file: str | None = Field(
        None, description="libsvm: the training file's name inside root (e.g. a9a; a .gz or .bz2 "
                          "next to it is found too); labels are mapped to 0..C-1 in sorted order")
    test_file: str | None = Field(
        None, description="libsvm: the test file's name inside root (e.g. a9a.t); without it, a "
                          "stratified test_fraction of the training file is held out")
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
    options: dict[str, Any] = options_field("dataset")

    _dump = model_serializer(mode="wrap")(drop_empty_options)
    _known = field_validator("name")(name_validator(DATASETS, BUILTIN_DATASETS, "data.name"))

    @model_validator(mode="after")
    def _plugin_keys(self):
        builtin = self.name in BUILTIN_DATASETS
        if self.options and builtin:
            raise ValueError(f"data.options is read by dataset plugins only, not by the built-in "
                             f"'{self.name}'; remove it")
        if not builtin and self.root is not None:
            raise ValueError(f"data.root is not read by the dataset plugin '{self.name}'; remove "
                             "it (pass a folder in data.options if the plugin takes one)")
        return self

    @model_validator(mode="after")
    def _libsvm_files(self):
        if self.name != "libsvm":
            for key in ("file", "test_file"):
                if getattr(self, key) is not None:
                    raise ValueError(f"data.{key} is only read by name 'libsvm' but name is "
                                     f"{self.name!r}; remove it or set name: libsvm")
        elif self.file is None:
            raise ValueError("data.name 'libsvm' needs data.file, the LIBSVM file's name inside "
                             f"data.root (e.g. file: a9a, from {LIBSVM_URL})")
        return self

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
    elif config.name in ("synthetic", "breast_cancer"):
        if config.name == "synthetic":
            x, y, num_classes = _synthetic(config.synthetic, seed)
        else:
            x, y, num_classes = _breast_cancer()
        x_train, x_test, y_train, y_test = _split(x, y, config.test_fraction, seed)
        mean, std = x_train.mean(0), x_train.std(0) + 1e-8  # train statistics only
        x_train, x_test = (x_train - mean) / std, (x_test - mean) / std
    elif config.name not in BUILTIN_DATASETS:
        x_train, y_train, x_test, y_test, num_classes = plugin_dataset(config, seed)
        if x_test is None:
            x_train, x_test, y_train, y_test = _split(x_train, y_train, config.test_fraction, seed)
    elif config.name == "libsvm":
        x_train, y_train, x_test, y_test, num_classes = read_libsvm_dataset(
            config.root, config.file, config.test_file)
        if x_test is None:
            x_train, x_test, y_train, y_test = _split(x_train, y_train, config.test_fraction, seed)
    elif config.name == "cifar10":
        x_train, y_train, x_test, y_test = read_cifar10_dataset(config.root)
        num_classes = CIFAR10_CLASSES
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
    for part, ys in (("training", y_train), ("test", y_test)):
        if len(ys) == 0:  # an accuracy of 0 on nothing would read as a result
            raise UserError(f"data: dataset '{config.name}' leaves an empty {part} set (after "
                            "data.classes, the test split and the caps); give it samples, e.g. a "
                            "larger data.test_fraction or other data files")
    return Dataset(config.name, np.ascontiguousarray(x_train, np.float32), y_train.astype(np.int64),
                   np.ascontiguousarray(x_test, np.float32), y_test.astype(np.int64),
                   num_classes, tuple(x_train.shape[1:]))


def plugin_dataset(config: DataConfig, seed: int):
    """(x_train, y_train, x_test, y_test, classes) of the dataset plugin ``config.name``: its
    callable ``(seed, **data.options)``, the arrays checked (float inputs of one shape, integer
    labels 0..C-1 as many as inputs; the test pair both given or both None). C is the plugin's
    ``facts()['classes']`` when it declares it, else 1 + the largest label seen. Anything wrong,
    the plugin's own exceptions included, is one ``UserError`` naming it."""
    name = config.name
    loader = DATASETS.get(name, "data.name")
    where = f"data.name: the dataset plugin '{name}'"
    try:
        out = loader(seed, **config.options)
    except UserError:
        raise
    except Exception as err:  # noqa: BLE001 - the plugin's own failure, reported as such
        raise UserError(f"{where} failed: {type(err).__name__}: {str(err)[:200]}") from None
    if not isinstance(out, tuple | list) or len(out) != 4:
        raise UserError(f"{where} returned {type(out).__name__}; return a tuple (x_train, "
                        "y_train, x_test, y_test), the test pair None to have it split off")
    if (out[2] is None) != (out[3] is None):
        raise UserError(f"{where} returned only one of x_test, y_test; give both or neither")
    arrays = []
    for part, (x, y) in (("train", out[:2]), ("test", out[2:])):
        if x is None:
            arrays += [None, None]
            continue
        try:
            x = np.asarray(x, dtype=np.float32)
            y_raw = np.asarray(y)
        except (TypeError, ValueError) as err:
            raise UserError(f"{where}: x_{part}/y_{part} are not numeric arrays ({err})") from None
        if x.ndim < 2 or y_raw.ndim != 1 or len(x) != len(y_raw) or not len(y_raw):
            raise UserError(f"{where}: x_{part} must be [n, ...] and y_{part} [n] with n >= 1; "
                            f"got shapes {x.shape} and {y_raw.shape}")
        if not np.issubdtype(y_raw.dtype, np.integer) or y_raw.min() < 0:
            raise UserError(f"{where}: y_{part} must hold integer labels 0..C-1; got "
                            f"{y_raw.dtype} values from {y_raw.min()}")
        if not np.isfinite(x).all():
            raise UserError(f"{where}: x_{part} holds NaN or infinite values; clean them")
        arrays += [x, y_raw.astype(np.int64)]
    if arrays[2] is not None and arrays[0].shape[1:] != arrays[2].shape[1:]:
        raise UserError(f"{where}: train inputs are {arrays[0].shape[1:]} but test inputs are "
                        f"{arrays[2].shape[1:]}; give both one shape")
    seen = 1 + max(int(y.max()) for y in arrays[1::2] if y is not None)
    declared = plugin_facts(config).get("classes")
    if declared is not None and seen > declared:
        raise UserError(f"{where}: labels go up to {seen - 1} but its facts declare {declared} "
                        "classes; fix one of them")
    return (*arrays, declared or seen)


def plugin_facts(config: DataConfig) -> dict:
    """A dataset plugin's ``facts(**options)``: a mapping with any of input_shape (per sample),
    classes, train_samples, test_samples (None or absent: the test set is split off); {} when
    the plugin declares none."""
    loader = DATASETS.get(config.name, "data.name")
    facts = getattr(loader, "facts", None)
    if facts is None:
        return {}
    where = f"data.name: the facts of dataset plugin '{config.name}'"
    try:
        out = facts(**config.options)
    except Exception as err:  # noqa: BLE001 - the plugin's own failure, reported as such
        raise UserError(f"{where} failed: {type(err).__name__}: {str(err)[:200]}") from None
    keys = {"input_shape", "classes", "train_samples", "test_samples"}
    if not isinstance(out, dict) or set(out) - keys:
        raise UserError(f"{where} must be a dict with keys among {sorted(keys)}; got {out!r:.80}")
    try:
        return {k: (tuple(int(d) for d in v) if k == "input_shape" else int(v))
                for k, v in out.items() if v is not None}
    except (TypeError, ValueError):
        raise UserError(f"{where}: input_shape must be a tuple of ints and the counts ints; got "
                        f"{out!r:.80}") from None


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


def _breast_cancer() -> tuple[np.ndarray, np.ndarray, int]:
    """sklearn's Wisconsin diagnostic breast cancer set: 569 x 30, label 0 malignant, 1 benign."""
    from sklearn.datasets import load_breast_cancer

    bunch = load_breast_cancer()
    return bunch.data.astype(np.float32), bunch.target.astype(np.int64), 2


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

# Largest IDX file accepted, as its header declares it (uncompressed): MNIST's training images
# are 47 MB; a header declaring more is a damaged or hostile file, refused before any read [D].
IDX_MAX_BYTES = 2**31
IDX_CLASSES = 10  # MNIST and FashionMNIST label 0..9


# Samples of the built-in sets (scikit-learn's load_digits: 1797; load_breast_cancer: 569).
BUILTIN_SAMPLES = {"digits": 1797, "digits28": 1797, "breast_cancer": 569}
BUILTIN_SHAPES = {"digits": (64,), "digits28": (1, 28, 28), "breast_cancer": (30,)}


@dataclass(frozen=True)
class DataFacts:
    """What a dataset will be, known before it is loaded (None where only loading tells):
    the per-sample input shape, the labels of the raw set, and the training samples left after
    the test split and ``max_train_samples`` (before a label selection)."""

    input_shape: tuple[int, ...] | None
    labels: int | None
    train_samples: int | None


def data_facts(config: DataConfig) -> DataFacts:
    """``DataFacts`` of ``config``, checked against the disk without reading the data: the folder
    and files exist, and IDX headers are sane (magic number, dimensions, sizes that match the
    files and each other). ``wirelessfl validate`` and the start of a run call it
    (pipeline/preflight.py), so that a missing folder is refused before anything is created."""
    if config.name not in BUILTIN_DATASETS:
        facts = plugin_facts(config)
        train = facts.get("train_samples")
        if train is not None and facts.get("test_samples") is None:
            train -= math.ceil(config.test_fraction * train)
        return DataFacts(facts.get("input_shape"), facts.get("classes"),
                         None if train is None else _at_most(train, config.max_train_samples))
    if config.name == "libsvm":
        libsvm_paths(config.root, config.file, config.test_file)
        return DataFacts(None, None, None)
    if config.name == "cifar10":
        paths = cifar10_paths(config.root)
        train = sum(cifar10_records(p) for p in paths[:-1])
        cifar10_records(paths[-1])  # a damaged test batch is refused before the run too
        return DataFacts(CIFAR10_SHAPE, CIFAR10_CLASSES, _at_most(train, config.max_train_samples))
    if config.name in _IDX_TITLES:
        dims = _idx_shapes(idx_paths(config.root, config.name), config.name)
        shape, train = (1, *dims["train-images-idx3-ubyte"][1:]), dims["train-labels-idx1-ubyte"][0]
        return DataFacts(shape, IDX_CLASSES, _at_most(train, config.max_train_samples))
    if config.name == "synthetic":
        syn = config.synthetic
        shape, labels, total = (syn.num_features,), syn.num_classes, syn.num_samples
    else:
        shape, labels, total = (BUILTIN_SHAPES[config.name], BUILTIN_CLASSES[config.name],
                                BUILTIN_SAMPLES[config.name])
    test = math.ceil(config.test_fraction * total)  # sklearn's train_test_split
    _check_split(config.test_fraction, total, test, labels)
    return DataFacts(shape, labels, _at_most(total - test, config.max_train_samples))


def _check_split(test_fraction: float, total: int, test: int, labels: int) -> None:
    """The stratified split (``_split``) needs at least one sample of every label on each side
    (scikit-learn's StratifiedShuffleSplit), which the sizes alone tell."""
    if min(test, total - test) < labels:
        # the fractions that work, in thousandths: ceil(f total) >= labels needs
        # f > (labels - 1) / total; ceil(f total) <= total - labels needs f <= that / total
        low = math.floor(1000 * (labels - 1) / total) + 1
        high = math.floor(1000 * (total - labels) / total)
        fix = (f"set data.test_fraction between {low / 1000:g} and {high / 1000:g}, or use more "
               "samples" if low <= high else f"use at least {2 * labels} samples")
        raise UserError(f"data.test_fraction={test_fraction} cannot split {total} samples with "
                        f"stratification: it leaves {total - test} training and {test} test "
                        f"samples, and each side needs one sample of each of the {labels} "
                        f"labels; {fix}")


def _at_most(count: int, limit: int | None) -> int:
    return count if limit is None else min(count, limit)


def idx_root(root: str | None, name: str) -> str | None:
    """The folder an image file set (IDX, CIFAR-10) is read from: ``data.root`` when given,
    else the folder a distribution package installs it in (DISTRIBUTION_ROOTS) when it is
    there, else None."""
    if root is not None:
        return root
    installed = DISTRIBUTION_ROOTS.get(name)
    return installed[0] if installed is not None and Path(installed[0]).is_dir() else None


def idx_paths(root: str | None, name: str) -> dict[str, Path]:
    """The four IDX files of dataset ``name`` in ``root`` (plain or .gz), or one clean error.
    Without ``root``, a set a distribution package installs (DISTRIBUTION_ROOTS) is read from
    where the package puts it, so the paper's data needs no option once installed."""
    title = _IDX_TITLES.get(name, name)
    wanted = ", ".join(f"{f}.gz" for f in IDX_FILES)
    root = idx_root(root, name)
    if root is None:
        installed = DISTRIBUTION_ROOTS.get(name)
        if installed is not None:
            raise UserError(f"dataset '{name}' is not installed: install it with `apt-get install "
                            f"{installed[1]}` (it puts the {title} files in {installed[0]}), or "
                            f"set data.root to a folder holding the four IDX files ({wanted})")
        else:
            raise UserError(f"dataset '{name}' needs data.root: set it to a folder holding the "
                            f"four {title} IDX files ({wanted})")
    folder = Path(root).expanduser()
    if not folder.is_dir():
        raise UserError(f"data.root folder {folder} does not exist: put the four {title} IDX files "
                        f"({wanted}) there, or fix data.root")
    paths = {f: _find(folder, f) for f in IDX_FILES}
    missing = [f for f, p in paths.items() if p is None]
    if missing:
        raise UserError(f"data.root folder {folder} lacks {', '.join(missing)} (plain or .gz): put "
                        f"the four {title} IDX files ({wanted}) in {folder}, or set data.root")
    return paths


def _idx_shapes(paths: dict[str, Path], name: str) -> dict[str, list[int]]:
    """The dimensions each IDX header declares, checked against each other: as many labels as
    images per split, train and test images of one size."""
    dims = {f: idx_header(p, IDX_LABELS_MAGIC if "labels" in f else IDX_IMAGES_MAGIC)[0]
            for f, p in paths.items()}
    for split in ("train", "t10k"):
        images, labels = f"{split}-images-idx3-ubyte", f"{split}-labels-idx1-ubyte"
        if dims[images][0] != dims[labels][0]:
            raise UserError(f"{paths[images]} has {dims[images][0]} images but {paths[labels]} "
                            f"has {dims[labels][0]} labels; replace them with a matching pair")
    train, test = dims["train-images-idx3-ubyte"][1:], dims["t10k-images-idx3-ubyte"][1:]
    if not all(train) or not all(test):
        empty = "train" if not all(train) else "t10k"
        raise UserError(f"{paths[f'{empty}-images-idx3-ubyte']} declares images of "
                        f"{'x'.join(map(str, dims[f'{empty}-images-idx3-ubyte'][1:]))} pixels; "
                        "a model needs at least one pixel: replace it with the original file")
    if train != test:
        raise UserError(f"{_IDX_TITLES.get(name, name)} train images are {tuple(train)} pixels but "
                        f"test images are {tuple(test)}; in {paths['train-images-idx3-ubyte'].parent}"
                        ", use files from the same dataset")
    return dims


def read_idx_dataset(root: str | None, name: str):
    """(x_train, y_train, x_test, y_test) from the four IDX files in ``root``, pixels / 255."""
    paths = idx_paths(root, name)
    _idx_shapes(paths, name)
    arrays = []
    for split in ("train", "t10k"):
        images = read_idx(paths[f"{split}-images-idx3-ubyte"], IDX_IMAGES_MAGIC)
        labels = read_idx(paths[f"{split}-labels-idx1-ubyte"], IDX_LABELS_MAGIC)
        arrays += [scaled_pixels(images[:, None]), labels.astype(np.int64)]
    return tuple(arrays)


def scaled_pixels(images: np.ndarray) -> np.ndarray:
    """8-bit pixels as float32 in [0, 1] (pixel / 255): the one scaling of every image file set
    (IDX and CIFAR-10), so that a model sees the same input range whichever of them it reads."""
    return images.astype(np.float32) / 255.0


def _find(folder: Path, base: str) -> Path | None:
    for candidate in (folder / base, folder / f"{base}.gz"):
        if candidate.is_file():
            return candidate
    return None


def _open(path: Path):
    """The file's bytes as a stream, decompressed for .gz and .bz2."""
    import bz2

    if path.suffix == ".gz":
        return gzip.open(path, "rb")
    if path.suffix == ".bz2":
        return bz2.open(path, "rb")
    return path.open("rb")


def read_limited(path: Path, limit: int, what: str) -> bytes:
    """At most ``limit`` bytes of ``path`` (decompressed); a file that holds more is refused after
    reading limit + 1 bytes, so a small compressed file that expands to gigabytes (a "gzip
    bomb") costs no more than the limit. Unreadable files give one clean error naming the file."""
    try:
        with _open(path) as stream:
            raw = stream.read(limit + 1)
    except (OSError, EOFError, ValueError, zlib.error) as exc:
        raise UserError(f"{path} cannot be read ({type(exc).__name__}: {exc}); replace it with "
                        f"the original {what}") from None
    if len(raw) > limit:
        raise UserError(f"{path} holds more than {limit:,} bytes once decompressed, more than "
                        f"{what} should; replace it with the original file")
    return raw


def idx_header(path: Path, magic: int) -> tuple[list[int], int]:
    """(dimensions, header bytes) of an IDX file, checked: the magic number, non-negative
    dimensions, a declared size within IDX_MAX_BYTES, and (for a plain file) the file's size;
    for a .gz file the size its trailer records (mod 2^32)."""
    ndim = 3 if magic == IDX_IMAGES_MAGIC else 1
    kind = "image" if ndim == 3 else "label"
    header = 4 + 4 * ndim
    raw = _read_head(path, header, f"IDX {kind} file")
    if len(raw) < header:
        raise UserError(f"{path} is too short for an IDX {kind} file ({len(raw)} bytes); "
                        "replace it with the original file")
    found, *dims = struct.unpack(f">{1 + ndim}i", raw)
    if found != magic:
        raise UserError(f"{path} is not an IDX {kind} file (magic number {found}, expected {magic}); "
                        "replace it with the original file")
    if min(dims) < 0:
        raise UserError(f"{path} declares a negative dimension {dims} (corrupt header); replace "
                        "it with the original file")
    total = header + math.prod(dims)
    if total > IDX_MAX_BYTES:
        raise UserError(f"{path} declares shape {dims}: {total:,} bytes, more than an IDX file "
                        f"this loader accepts ({IDX_MAX_BYTES:,}); replace it with the original")
    if path.suffix == ".gz":  # the trailer's ISIZE: the uncompressed size mod 2^32
        with path.open("rb") as f:
            f.seek(-4, 2)
            actual, expected = struct.unpack("<I", f.read(4))[0], total % 2**32
    else:
        actual, expected = path.stat().st_size, total
    if actual != expected:
        raise UserError(f"{path} should hold {total} bytes for shape {dims} but holds {actual} "
                        "(truncated or corrupt); replace it with the original file")
    return dims, header


def _read_head(path: Path, size: int, what: str) -> bytes:
    """The first ``size`` bytes of ``path`` (decompressed)."""
    try:
        with _open(path) as stream:
            return stream.read(size)
    except (OSError, EOFError, zlib.error) as exc:
        raise UserError(f"{path} cannot be read ({type(exc).__name__}: {exc}); replace it with "
                        f"the original {what}") from None


def read_idx(path: Path, magic: int) -> np.ndarray:
    """A uint8 IDX array: images [n, rows, cols] (magic 2051) or labels [n] (magic 2049), read
    no further than the header declares; labels must lie in 0..9."""
    dims, header = idx_header(path, magic)
    kind = "image" if magic == IDX_IMAGES_MAGIC else "label"
    total = header + math.prod(dims)
    raw = read_limited(path, total, f"IDX {kind} file for shape {dims}")
    if len(raw) != total:
        raise UserError(f"{path} should hold {total} bytes for shape {dims} but holds {len(raw)} "
                        "(truncated or corrupt); replace it with the original file")
    array = np.frombuffer(raw, np.uint8, offset=header).reshape(dims)
    if magic == IDX_LABELS_MAGIC and array.size and int(array.max()) >= IDX_CLASSES:
        raise UserError(f"{path} holds label {int(array.max())} but MNIST-format labels are "
                        f"0..{IDX_CLASSES - 1}; replace it with the original file")
    return array


# --- CIFAR-10 binary files (Krizhevsky, "Learning Multiple Layers of Features from Tiny Images",
# 2009; format: https://www.cs.toronto.edu/~kriz/cifar.html, "Binary version") ----------------

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar.html"
CIFAR10_ARCHIVE = "cifar-10-binary.tar.gz"
CIFAR10_FOLDER = "cifar-10-batches-bin"  # what the binary archive unpacks to
CIFAR10_PICKLED_FOLDER = "cifar-10-batches-py"  # the Python version: pickles, never loaded
CIFAR10_FILES = (*(f"data_batch_{i}.bin" for i in range(1, 6)), "test_batch.bin")
# A record: 1 label byte (0..9), then 3,072 pixel bytes: the 1,024 red values, the 1,024 green,
# the 1,024 blue, each a 32x32 image row by row, so it reshapes to (3, 32, 32) channels first.
CIFAR10_SHAPE = (3, 32, 32)
CIFAR10_RECORD_BYTES = 1 + math.prod(CIFAR10_SHAPE)
CIFAR10_CLASSES = 10


def cifar10_folder(root: str) -> Path:
    """Where the batch files are looked for: ``root``'s cifar-10-batches-bin when it has one
    (root names where the archive was unpacked), else ``root`` itself (root names
    cifar-10-batches-bin). It checks nothing, so the memory estimate can size from it too."""
    folder = Path(root).expanduser()
    inner = folder / CIFAR10_FOLDER
    return inner if inner.is_dir() else folder


def cifar10_paths(root: str | None) -> list[Path]:
    """The six batch files of CIFAR-10's binary version (the five training batches, then the
    test batch), or one clean error naming the folder, the files and data.root."""
    source = f"{CIFAR10_ARCHIVE} from {CIFAR10_URL}"
    root = idx_root(root, "cifar10")
    if root is None:
        raise UserError(f"dataset 'cifar10' needs data.root: set it to the folder {CIFAR10_FOLDER} "
                        f"of CIFAR-10's binary version ({source}) or to the folder holding it")
    if not Path(root).expanduser().is_dir():
        raise UserError(f"data.root folder {Path(root).expanduser()} does not exist: unpack "
                        f"CIFAR-10's binary version ({source}) there, or fix data.root")
    folder = cifar10_folder(root)
    paths = [folder / name for name in CIFAR10_FILES]
    missing = [p.name for p in paths if not p.is_file()]
    if missing and _cifar10_pickled(folder):
        raise UserError(f"data.root folder {folder} holds the pickled Python version of CIFAR-10 "
                        "(cifar-10-batches-py), which is never loaded (unpickling a file runs "
                        f"code); download the binary version ({source}) and point data.root at "
                        f"its {CIFAR10_FOLDER}")
    if missing:
        raise UserError(f"data.root folder {folder} lacks {', '.join(missing)}: CIFAR-10's binary "
                        f"version is the six files {', '.join(CIFAR10_FILES)} ({CIFAR10_FOLDER} "
                        f"in {source}); put them in {folder}, or set data.root to their folder")
    return paths


def _cifar10_pickled(folder: Path) -> bool:
    """Whether ``folder`` holds CIFAR-10's Python version (cifar-10-batches-py, or batch files
    named without .bin), so that the error says which version to fetch instead."""
    return (folder.name == CIFAR10_PICKLED_FOLDER or (folder / CIFAR10_PICKLED_FOLDER).is_dir()
            or (folder / "data_batch_1").is_file())


def cifar10_records(path: Path) -> int:
    """The records a batch file holds, from its size alone (records have a fixed size, there is
    no header): a size that is not a whole number of records is a truncated or foreign file."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise UserError(f"{path} cannot be read ({type(exc).__name__}: {exc}); replace it with "
                        "the original CIFAR-10 batch file") from None
    if size % CIFAR10_RECORD_BYTES:
        raise UserError(f"{path} holds {size:,} bytes, not a whole number of "
                        f"{CIFAR10_RECORD_BYTES:,}-byte CIFAR-10 records (truncated or corrupt); "
                        "replace it with the original file")
    return size // CIFAR10_RECORD_BYTES


def read_cifar10_batch(path: Path, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 images [count, 3, 32, 32], int64 labels [count]) of one batch file, read with numpy
    (the binary version needs no unpickling) no further than ``count`` records; labels must lie
    in 0..9."""
    try:
        raw = np.fromfile(path, np.uint8, count=count * CIFAR10_RECORD_BYTES)
    except (OSError, ValueError) as exc:
        raise UserError(f"{path} cannot be read ({type(exc).__name__}: {exc}); replace it with "
                        "the original CIFAR-10 batch file") from None
    if raw.size != count * CIFAR10_RECORD_BYTES:
        raise UserError(f"{path} should hold {count} records but holds {raw.size:,} bytes "
                        "(truncated while read); replace it with the original file")
    records = raw.reshape(count, CIFAR10_RECORD_BYTES)
    labels = records[:, 0]
    if count and int(labels.max()) >= CIFAR10_CLASSES:
        first = int(np.argmax(labels >= CIFAR10_CLASSES))
        raise UserError(f"{path} holds label {int(labels[first])} (record {first + 1}) but "
                        f"CIFAR-10 labels are 0..{CIFAR10_CLASSES - 1}; replace it with the "
                        "original file")
    return records[:, 1:].reshape(count, *CIFAR10_SHAPE), labels.astype(np.int64)


def _cifar10_split(paths: list[Path]) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of batch files read one after another into one uint8 array, then scaled as the IDX
    sets are: no list of batches and concatenated copy, so the loader's peak is the IDX loader's
    (uint8 + two float32 arrays) that the memory estimate counts."""
    counts = [cifar10_records(p) for p in paths]
    images = np.empty((sum(counts), *CIFAR10_SHAPE), np.uint8)
    labels = np.empty(sum(counts), np.int64)
    start = 0
    for path, count in zip(paths, counts):
        images[start:start + count], labels[start:start + count] = read_cifar10_batch(path, count)
        start += count
    return scaled_pixels(images), labels


def read_cifar10_dataset(root: str | None):
    """(x_train, y_train, x_test, y_test) from the six batch files in ``root`` (or its
    cifar-10-batches-bin): the five training batches in file order, then the test batch."""
    paths = cifar10_paths(root)
    return (*_cifar10_split(paths[:-1]), *_cifar10_split(paths[-1:]))


# --- LIBSVM files (https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/) ------------------

# A compressed LIBSVM file may expand to at most this many times its size (text numbers
# compress 3-20x; a 1.5 MB gzip bomb expands 1000x) [D], and a LIBSVM file to at most this many
# bytes of text [D].
LIBSVM_MAX_EXPANSION = 100
LIBSVM_MAX_TEXT_BYTES = 8 * 2**30
# Feature indices are C ints in sklearn's parser.
LIBSVM_MAX_INDEX = 2**31 - 2


def libsvm_paths(root: str | None, file: str, test_file: str | None = None) -> list[Path]:
    """The LIBSVM file(s) in ``root`` (plain, .gz or .bz2), or one clean error."""
    names = [file] if test_file is None else [file, test_file]
    where = f"put the LIBSVM file(s) {', '.join(map(repr, names))} ({LIBSVM_URL})"
    if root is None:
        raise UserError(f"dataset 'libsvm' needs data.root: {where} in a folder and set data.root "
                        "to it")
    folder = Path(root).expanduser()
    if not folder.is_dir():
        raise UserError(f"data.root folder {folder} does not exist: {where} in {folder}, or fix "
                        "data.root")
    paths = []
    for key, name in zip(("file", "test_file"), names):
        path = _find_any(folder, name, ("", ".gz", ".bz2"))
        if path is None:
            raise UserError(f"data.root folder {folder} has no file {name!r} (plain, .gz or .bz2): "
                            f"put the LIBSVM file {name!r} ({LIBSVM_URL}) in {folder}, or set "
                            f"data.{key}")
        paths.append(path)
    return paths


def _libsvm_text(path: Path) -> bytes:
    """The file's text, decompressed within LIBSVM_MAX_EXPANSION times its size."""
    size = path.stat().st_size
    limit = LIBSVM_MAX_TEXT_BYTES
    if path.suffix in (".gz", ".bz2"):
        limit = min(limit, LIBSVM_MAX_EXPANSION * size + 2**20)
    return read_limited(path, limit, "LIBSVM file")


def read_libsvm_dataset(root: str | None, file: str, test_file: str | None = None):
    """(x_train, y_train, x_test, y_test, num_classes) from LIBSVM files in ``root``; x_test and
    y_test are None without ``test_file``.

    Both files are read together (sklearn ``load_svmlight_files``), so they share the number of
    features (the larger of the two) and the zero- or one-based indexing. Inputs come back dense
    float32; labels are mapped to 0..C-1 in the sorted order of the distinct values of both
    files, so {-1, +1}, {0, 1} and {1, 2} all become {0, 1}.
    """
    import io

    from sklearn.datasets import load_svmlight_files

    paths = libsvm_paths(root, file, test_file)
    texts = [_libsvm_text(p) for p in paths]
    try:
        arrays = load_svmlight_files([io.BytesIO(t) for t in texts], dtype=np.float64)
    except (ValueError, OSError, EOFError, OverflowError, zlib.error) as exc:
        path, line = _first_bad_libsvm_line(paths, texts)
        at = f"{path}, line {line}" if line else f"{path}"
        # The line's text is not quoted: data.root may name any file on the machine.
        raise UserError(f"{at} is not valid LIBSVM format ({type(exc).__name__}); each line must "
                        "read '<label> <index>:<value> ...' with increasing indices below "
                        f"{LIBSVM_MAX_INDEX + 1:,}") from None
    xs, ys = arrays[0::2], arrays[1::2]
    rows, features = sum(x.shape[0] for x in xs), xs[0].shape[1]
    if rows * features * 4 > LIBSVM_MAX_DENSE_BYTES:
        raise UserError(f"{paths[0]}: {rows} samples x {features} features would take "
                        f"{rows * features * 4 / 2**30:.1f} GiB dense (float32), more than "
                        f"{LIBSVM_MAX_DENSE_BYTES / 2**30:.0f} GiB; use a smaller LIBSVM set")
    for path, x, y in zip(paths, xs, ys):
        if len(y) == 0:
            raise UserError(f"{path} holds no samples; replace it with a LIBSVM file that has some")
        bad = ~np.isfinite(x.data)
        if bad.any() or not np.isfinite(y).all():
            # a NaN feature would only show later as the algorithm "diverging"
            row = (int(np.searchsorted(x.indptr, np.flatnonzero(bad)[0], side="right")) if
                   bad.any() else int(np.flatnonzero(~np.isfinite(y))[0]) + 1)
            raise UserError(f"{path}: sample {row} (counting from 1) holds a NaN or an "
                            "infinite value; a classifier cannot learn from it: remove or fix "
                            "such values in the file")
    values = np.unique(np.concatenate(ys))
    if len(values) < 2:
        raise UserError(f"{paths[0]} has a single label ({values[0]:g}); a classifier needs at "
                        "least two: use another LIBSVM file")
    out = []
    for x, y in zip(xs, ys):
        out += [np.asarray(x.toarray(), dtype=np.float32), np.searchsorted(values, y).astype(np.int64)]
    if test_file is None:
        out += [None, None]
    return (*out, len(values))


def _find_any(folder: Path, base: str, suffixes: tuple[str, ...]) -> Path | None:
    for suffix in suffixes:
        candidate = folder / f"{base}{suffix}"
        if candidate.is_file():
            return candidate
    return None


def _first_bad_libsvm_line(paths: list[Path], texts: list[bytes]) -> tuple[Path, int | None]:
    """(file, line number) of the first line that is not '<label> [qid:<int>] <index>:<value>
    ...' with increasing indices below LIBSVM_MAX_INDEX; (first file, None) when none is
    found."""
    for path, text in zip(paths, texts):
        for number, raw in enumerate(text.decode("utf-8", "replace").splitlines(), start=1):
            line = raw.split("#", 1)[0].strip()
            if line and not _libsvm_line_ok(line):
                return path, number
    return paths[0], None


def _libsvm_line_ok(line: str) -> bool:
    label, *pairs = line.split()
    try:
        float(label)
        previous = -1
        for k, pair in enumerate(pairs):
            index, sep, value = pair.partition(":")
            if not sep:
                return False
            if k == 0 and index == "qid":
                int(value)
                continue
            index_value = int(index)
            float(value)
            if index_value <= previous or index_value > LIBSVM_MAX_INDEX:
                return False
            previous = index_value
    except ValueError:
        return False
    return True
