"""A dataset's size from the scenario alone, for the memory estimate (pipeline/memory.py):
what every problem on ``scenario.data`` holds of it (``data_bytes``; each problem's ``memory``
hook adds its own arrays), found from the catalog, the synthetic section, the IDX headers, the
sizes of CIFAR-10's batch files or a streaming pass over a LIBSVM file, without loading the data.
It sits with the problems because only a problem knows which data it reads and how it holds it.
"""

from __future__ import annotations

import bz2
import gzip
import math
import re
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from wirelessfl.contract.memory import BYTES_PER_FLOAT, MIB
from wirelessfl.learning.datasets import (
    BUILTIN_DATASETS,
    CIFAR10_CLASSES,
    CIFAR10_FILES,
    CIFAR10_RECORD_BYTES,
    CIFAR10_SHAPE,
    cifar10_folder,
    idx_root,
    plugin_dataset,
    plugin_facts,
)
from wirelessfl.learning.partition import fewest_samples

# Per sample of a classifier's training set beyond its inputs: labels twice (or the labels once
# and DeviceData's index), the minibatch owner sizes and the objective's sample weights, the
# shard indices (int64 / float64 each).
SAMPLE_BYTES = 40
# The classifier's (problems/classifier.py): labels or index and the shard indices always; the
# minibatch owner sizes only when a device may hold fewer samples than a minibatch, the
# objective's sample weights only with training-set passes (both made on first use).
CLASSIFIER_SAMPLE_BYTES, OWNER_SIZE_BYTES, SAMPLE_WEIGHT_BYTES = 24, 8, 8
# Built-in datasets: (samples, input shape, classes), before the train/test split.
BUILTIN_SETS = {"digits": (1797, (64,), 10), "digits28": (1797, (1, 28, 28), 10),
                "breast_cancer": (569, (30,), 2)}
IDX_FILES = ("train-images-idx3-ubyte", "t10k-images-idx3-ubyte")

# ---- a dataset's size -----------------------------------------------------------------------
@dataclass(frozen=True)
class DataShape:
    """A dataset's size as the run will hold it, and as it is loaded (before label selection
    and subsampling): ``loaded_values`` input values at ``load_bytes`` bytes each at the
    loader's peak."""

    train: int
    test: int
    input_shape: tuple[int, ...]
    classes: int
    loaded_values: int = 0
    load_bytes: int = 0


# Bytes per input value at a loader's peak: IDX (and CIFAR-10) uint8 + float32 + the scaled
# float32; LIBSVM float64 dense + float32 (plus the sparse matrix, about as large again at worst);
# make_classification's float64 draws, their float32 copy and the standardised split.
LOAD_BYTES = {"idx": 9, "libsvm": 24, "synthetic": 24, "builtin": 24}


def dataset_shape(data, limit_bytes: float = math.inf) -> DataShape:
    """The size of ``data`` (a DataConfig) without loading it: the catalog's sizes, the
    synthetic section, the IDX headers, the CIFAR-10 batch files' sizes, or a streaming count
    of a LIBSVM file's lines and largest feature index (stopped once the dense float32 array
    would exceed ``limit_bytes``).
    Unreadable files count as empty: the loader reports them."""
    name = data.name
    test = None
    if name not in BUILTIN_DATASETS:
        samples, shape, classes, test = _plugin_shape(data)
        kind = "builtin"
    elif name in BUILTIN_SETS:
        samples, shape, classes = BUILTIN_SETS[name]
        kind = "builtin"
    elif name == "synthetic":
        cfg = data.synthetic
        samples, shape, classes = cfg.num_samples, (cfg.num_features,), cfg.num_classes
        kind = "synthetic"
    elif name == "libsvm":
        samples, features, test = _libsvm_shape(data, limit_bytes)
        shape, classes, kind = (features,), 2, "libsvm"
    elif name == "cifar10":  # fixed-size records: the files' sizes give the counts
        samples, test = _cifar10_counts(idx_root(data.root, name))
        shape, classes, kind = CIFAR10_SHAPE, CIFAR10_CLASSES, "idx"
    else:  # mnist, fashionmnist: the IDX headers give (count, rows, cols)
        counts = [_idx_dims(idx_root(data.root, name), f) for f in IDX_FILES]
        samples, test = counts[0][0], counts[1][0]
        shape, classes, kind = (1, *counts[0][1:]), 10, "idx"
    loaded = (samples + (test or 0)) * math.prod(shape)
    if test is None:  # one set, split: the stratified test share
        test = math.ceil(data.test_fraction * samples)
        samples -= test
    if data.classes is not None and name != "libsvm":  # a share of the labels is kept
        keep = len(data.classes) / classes
        samples, test = math.ceil(keep * samples), math.ceil(keep * test)
    if data.classes is not None:
        classes = len(data.classes)
    elif data.positive_classes is not None:
        classes = 2
    samples = min(samples, data.max_train_samples or samples)
    test = min(test, data.max_test_samples or test)
    return DataShape(samples, test, shape, classes, loaded, LOAD_BYTES[kind])


def _plugin_shape(data) -> tuple[int, tuple[int, ...], int, int | None]:
    """(training samples, input shape, classes, test samples or None) of a dataset plugin: its
    declared facts, or, where it declares too few, the arrays it returns (seed 0)."""
    facts = plugin_facts(data)
    if {"input_shape", "classes", "train_samples"} <= set(facts):
        return (facts["train_samples"], facts["input_shape"], facts["classes"],
                facts.get("test_samples"))
    x_train, _, x_test, _, classes = plugin_dataset(data, 0)
    return len(x_train), tuple(x_train.shape[1:]), classes, None if x_test is None else len(x_test)


def _idx_dims(root: str | None, base: str) -> tuple[int, int, int]:
    """(count, rows, cols) from an IDX image file's header (plain or .gz: 16 bytes are
    decompressed), or zeros when it cannot be read."""
    if root is None:
        return 0, 0, 0
    folder = Path(root).expanduser()
    for path, opener in ((folder / base, open), (folder / f"{base}.gz", gzip.open)):
        if path.is_file():
            try:
                with opener(path, "rb") as fh:
                    head = fh.read(16)
            except (OSError, EOFError, zlib.error):
                return 0, 0, 0
            if len(head) == 16:
                _, *dims = struct.unpack(">4i", head)
                return tuple(max(0, v) for v in dims)
    return 0, 0, 0


def _cifar10_counts(root: str | None) -> tuple[int, int]:
    """(training, test) records of CIFAR-10's binary batch files, from their sizes (3,073 bytes
    a record) without reading them; a missing file counts as empty (the loader reports it)."""
    if root is None:
        return 0, 0
    folder = cifar10_folder(root)
    counts = [(folder / name).stat().st_size // CIFAR10_RECORD_BYTES
              if (folder / name).is_file() else 0 for name in CIFAR10_FILES]
    return sum(counts[:-1]), counts[-1]


_FEATURE = re.compile(rb"(\d+):")
# Feature indices a LIBSVM reader accepts (int32); a larger one is the loader's error to report.
LIBSVM_INDEX_LIMIT = 2**31 - 1


def _largest_index(block: bytes) -> int:
    """1 + the largest valid feature index in ``block`` (0 without any)."""
    found = [i for i in map(int, _FEATURE.findall(block)) if i < LIBSVM_INDEX_LIMIT]
    return max(found) + 1 if found else 0


def _libsvm_shape(data, limit_bytes: float) -> tuple[int, int, int | None]:
    """(training lines, features, test lines or None) of a LIBSVM file pair, by one streaming
    pass (plain, .gz or .bz2); stops once lines x features x 4 B exceeds ``limit_bytes``."""
    if data.root is None:
        return 0, 0, None
    folder = Path(data.root).expanduser()
    lines, features = [], 0
    for name in filter(None, (data.file, data.test_file)):
        count = 0
        for path, opener in ((folder / name, open), (folder / f"{name}.gz", gzip.open),
                             (folder / f"{name}.bz2", bz2.open)):
            if not path.is_file():
                continue
            try:
                with opener(path, "rb") as fh:
                    tail = b""
                    while block := fh.read(16 * MIB):
                        block = tail + block
                        cut = block.rfind(b"\n") + 1
                        block, tail = block[:cut], block[cut:]
                        count += block.count(b"\n")
                        features = max(features, _largest_index(block))
                        if (sum(lines) + count) * features * BYTES_PER_FLOAT > limit_bytes:
                            return sum(lines) + count, features, None
                    count += bool(tail.strip())
                    features = max(features, _largest_index(tail))
            except (OSError, EOFError, ValueError, zlib.error):
                pass
            break
        lines.append(count)
    return lines[0], features, (lines[1] if len(lines) > 1 else None)


@dataclass(frozen=True)
class DataBytes:
    """A problem on data, sized from the scenario: ``shape`` (``dataset_shape``), values per
    sample, the dataset in device order and as loaded plus the test set and per-sample
    bookkeeping (``held``, ``SAMPLE_BYTES`` an entry of the devices' index sets, ``entries``),
    the loader's peak (``load``), training samples on devices."""

    shape: DataShape
    input_size: int
    held: int
    load: int
    on_devices: int
    entries: int


def drawn_samples(scenario, on_devices: int) -> int | None:
    """Entries of the devices' index sets when they draw with replacement (learning/
    partition.py: ``samples_per_device`` given, or the population outgrows the ``on_devices``
    training samples), else None (the split holds each sample once). client-dirichlet draws
    its own sizes: N x their mean, max(min_samples, median e^(sigma^2 / 2)) [D]; label-skew
    is taken to outgrow the data when N x classes_per_device exceeds it (the split's own test
    is per class) [D]."""
    config, n = scenario.partition, scenario.population.num_devices
    params = config.params()
    fewest = fewest_samples(config.scheme, params)
    if config.scheme == "client-dirichlet":
        if n * fewest <= on_devices:
            return None
        mean = config.size_median * math.exp(config.size_sigma ** 2 / 2)
        return math.ceil(n * max(fewest, mean))
    if config.samples_per_device is None and n * fewest <= on_devices:
        return None
    return n * (config.samples_per_device or fewest)


def data_bytes(scenario, limit_bytes: float = math.inf) -> DataBytes:
    """What every problem on ``scenario.data`` holds of it (the problems' memory hooks add their
    own arrays): the inputs as loaded and as the devices read them (in device order, or the
    training set once when the entries drawn with replacement, ``drawn_samples``, outnumber it:
    DeviceData's index), the test set, ``SAMPLE_BYTES`` of bookkeeping per entry (a problem
    holding less re-prices them: ``classifier_sample_bytes``)."""
    shape = dataset_shape(scenario.data, limit_bytes)
    input_size = math.prod(shape.input_shape)
    on_devices = round(shape.train * (1 - scenario.data.server_fraction))
    entries = drawn_samples(scenario, on_devices) or shape.train
    rows = min(entries, shape.train)
    held = BYTES_PER_FLOAT * input_size * (shape.train + rows + shape.test) \
        + SAMPLE_BYTES * entries
    return DataBytes(shape, input_size, held, shape.load_bytes * shape.loaded_values, on_devices,
                     entries)


def classifier_sample_bytes(scenario, entries_per_device: float, training_passes: bool) -> int:
    """Bookkeeping bytes per entry of the classifier's index sets: the owner sizes when
    ``entries_per_device`` (the mean share) is below some algorithm's minibatch, the sample
    weights with ``training_passes``."""
    batches = [getattr(a, "batch_size", 0) or 0 for a in scenario.algorithms]
    short = entries_per_device < max(batches, default=0)
    return (CLASSIFIER_SAMPLE_BYTES + (OWNER_SIZE_BYTES if short else 0)
            + (SAMPLE_WEIGHT_BYTES if training_passes else 0))
