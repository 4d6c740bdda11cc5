"""Splitting the training set over devices: each scheme returns every device's index set.

Every partitioner in PARTITIONERS takes (labels [n], num_devices, rng, **params) and returns a
``DeviceSamples``: one index set into the training set per device, stored as one array (device
after device) and the sizes, so that a million devices are two arrays rather than a million.
Split from the training set (the schemes as published), the sets are disjoint, each non-empty,
together the whole set or (label-skew, client-dirichlet) a subset of it. ``SCHEME_PARAMS`` says
which keyword parameters each scheme reads; the scenario schema refuses the others. Errors name
the scenario key and the fix.

With replacement [D]: when the population outgrows the training set (the split would leave a
device fewer samples than the scheme allows, where the schemes as published refuse or empty a
device), or when ``samples_per_device`` = m is given, every device instead draws its samples
from the whole training set, independently of the other devices, so one sample may be held by
several devices (``DeviceSamples.with_replacement``). Each scheme keeps its own kind of
heterogeneity in that draw (``_with_replacement``); m defaults to the fewest samples the
scheme allows a device (1, ``min_samples``, ``shards_per_device``, ``classes_per_device``),
which is what the split itself gives each device when N x that equals the training set. The
papers the schemes come from split a fixed dataset over fewer clients than samples and say
nothing about this case; the rule is ours.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from wirelessfl.errors import UserError


@dataclass(eq=False)
class DeviceSamples:
    """Every device's training samples as index sets into one dataset (compressed rows): device
    i holds ``order[offsets[i]:offsets[i] + sizes[i]]``. Two arrays whatever N (a list of N
    small arrays costs about 100 bytes and a Python object per device, and minutes to build
    at a million devices); ``with_replacement``: drawn per device, so an index may repeat."""

    order: np.ndarray  # [M] int64 indices, device after device
    sizes: np.ndarray  # [N] int64
    with_replacement: bool = False
    offsets: np.ndarray = field(init=False, repr=False)  # [N] int64, first entry of each device

    def __post_init__(self) -> None:
        self.order = np.asarray(self.order, dtype=np.int64)
        self.sizes = np.asarray(self.sizes, dtype=np.int64)
        if self.sizes.ndim != 1 or self.order.ndim != 1 or self.sizes.sum() != len(self.order):
            raise ValueError(f"sizes (sum {int(self.sizes.sum())}) must add up to the "
                             f"{len(self.order)} indices of order")
        self.offsets = np.cumsum(self.sizes) - self.sizes

    @classmethod
    def from_arrays(cls, arrays, with_replacement: bool = False) -> DeviceSamples:
        """From one index array per device (small populations, tests)."""
        arrays = [np.asarray(a, dtype=np.int64).ravel() for a in arrays]
        order = np.concatenate(arrays) if arrays else np.zeros(0, np.int64)
        return cls(order, np.array([len(a) for a in arrays], np.int64), with_replacement)

    @classmethod
    def coerce(cls, samples) -> DeviceSamples:
        """``samples`` as a DeviceSamples (one given, or one index array per device)."""
        return samples if isinstance(samples, DeviceSamples) else cls.from_arrays(samples)

    def __len__(self) -> int:
        return len(self.sizes)

    def of(self, device: int) -> np.ndarray:
        """Device ``device``'s indices (a view)."""
        start = self.offsets[device]
        return self.order[start:start + self.sizes[device]]

    def __getitem__(self, device: int) -> np.ndarray:
        if not -len(self) <= device < len(self):
            raise IndexError(f"device {device} of {len(self)}")
        return self.of(device % len(self))

    def __iter__(self) -> Iterator[np.ndarray]:
        """Each device's indices in turn: one Python object per device, for small populations
        (tests, reports of a few devices); vectorised code reads ``order`` and ``sizes``."""
        return (self.of(i) for i in range(len(self)))

    def owner(self) -> np.ndarray:
        """[M] the device of every entry of ``order``."""
        return np.repeat(np.arange(len(self.sizes), dtype=np.int64), self.sizes)

    def mapped(self, index: np.ndarray) -> DeviceSamples:
        """The same sets with every entry i replaced by ``index[i]`` (indices into a subset
        -> indices into the whole set)."""
        return DeviceSamples(np.asarray(index, dtype=np.int64)[self.order], self.sizes,
                             self.with_replacement)


Partitioner = Callable[..., DeviceSamples]

# Defaults of the schemes' parameters (the scenario schema fills these in).
DEFAULT_ALPHA = 0.5  # Dir(0.5): the label-skew setting of Li et al. 2022's (ICDE) experiments
DEFAULT_SHARDS_PER_DEVICE = 2  # McMahan et al. 2017 (AISTATS), Sec. 3: 2 shards per client
DEFAULT_BETA = 0.5  # Dir(0.5): the quantity-skew setting of Li et al. 2022's experiments
DEFAULT_CLASSES_PER_DEVICE = 2  # #C = 2, one of Li et al. 2022's settings (#C = 1, 2, 3)
DEFAULT_MIN_SAMPLES = 1
# Dirichlet draws tried before samples are moved to devices below min_samples (see dirichlet).
DIRICHLET_MAX_DRAWS = 100
# client-dirichlet: the seed-003 prototype's split (fgdro.md Sec. 5): rare classes keep 20 % of
# their weight, device sizes max(40, floor(LogNormal(ln 300, 0.8))).
DEFAULT_RARE_WEIGHT = 0.2
DEFAULT_SIZE_MEDIAN = 300.0
DEFAULT_SIZE_SIGMA = 0.8


def _check_devices(num_devices: int, available: int, need_each: int = 1,
                   key: str = "population.num_devices") -> None:
    if num_devices < 1:
        raise UserError(f"population.num_devices must be at least 1, got {num_devices}")
    if num_devices * need_each > available:
        raise UserError(f"{key}: {num_devices} devices x {need_each} samples each exceeds the "
                        f"{available} training samples, so some devices would get too little "
                        "data; use fewer devices or more data (data.max_train_samples, a larger "
                        "dataset)")


def _check_positive(value, key: str, integer: bool = False) -> None:
    if integer and (isinstance(value, bool) or not isinstance(value, int | np.integer)):
        raise UserError(f"{key} must be a positive integer, got {value!r}")
    if not (value > 0 and np.isfinite(value)):
        raise UserError(f"{key} must be a positive finite number, got {value!r}")


def _group(indices: np.ndarray, owner: np.ndarray, num_devices: int,
           rng: np.random.Generator) -> DeviceSamples:
    """Index sets per device from (sample index, owning device) pairs, in random order within
    each device (so no device's shard is sorted by class)."""
    shuffle = rng.permutation(len(indices))
    indices, owner = indices[shuffle], owner[shuffle]
    by_owner = np.argsort(owner, kind="stable")
    sizes = np.bincount(owner, minlength=num_devices)
    return DeviceSamples(indices[by_owner], sizes)


def _by_class(labels: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """All sample indices grouped by class (random order inside a class) and the class sizes."""
    order = rng.permutation(len(labels))
    order = order[np.argsort(labels[order], kind="stable")]
    return order, np.bincount(labels, minlength=int(labels.max()) + 1 if len(labels) else 0)


# ---- with replacement [D] (module docstring) ------------------------------------------------------
def fewest_samples(scheme: str, params: dict) -> int:
    """The fewest samples ``scheme`` allows one device: what every device draws when the
    population outgrows the training set and ``samples_per_device`` is not given."""
    if scheme == "shards":
        return int(params.get("shards_per_device", DEFAULT_SHARDS_PER_DEVICE))
    if scheme == "label-skew":
        return int(params.get("classes_per_device", DEFAULT_CLASSES_PER_DEVICE))
    if scheme in ("dirichlet", "quantity-skew", "client-dirichlet"):
        return int(params.get("min_samples", DEFAULT_MIN_SAMPLES))
    return 1


def drawn_count(samples_per_device: int | None, scheme: str, params: dict) -> int:
    """m, checked: at least what the scheme allows a device (``fewest_samples``)."""
    if samples_per_device is None:
        return fewest_samples(scheme, params)
    _check_positive(samples_per_device, "partition.samples_per_device", integer=True)
    fewest = fewest_samples(scheme, params)
    if samples_per_device < fewest:
        what = {"shards": "shards_per_device (one sample per shard)",
                "label-skew": "classes_per_device (one sample per class)"}.get(
                    scheme, "min_samples")
        raise UserError(f"partition.samples_per_device={samples_per_device} is below the "
                        f"{fewest} samples scheme '{scheme}' gives a device at least "
                        f"(partition.{what}); raise it to {fewest} or more")
    return int(samples_per_device)


def _pick(order: np.ndarray, starts: np.ndarray, class_sizes: np.ndarray, cls: np.ndarray,
          rng: np.random.Generator) -> np.ndarray:
    """For every entry of ``cls`` (a class, as an index into ``starts``), one of that class's
    samples uniformly (``order[starts[c]:starts[c] + class_sizes[c]]``), independently."""
    return order[starts[cls] + rng.integers(0, class_sizes[cls])]


def _draw_by_mix(order: np.ndarray, starts: np.ndarray, class_sizes: np.ndarray,
                 mix: np.ndarray, sizes: np.ndarray, rng: np.random.Generator) -> DeviceSamples:
    """Device j draws sizes[j] samples, each independently of class c with probability
    proportional to mix[j, c] (classes: those of ``starts``), then uniformly among the class's
    samples (``_pick``): i.i.d. entries, so no order inside a device to undo. In blocks of
    DRAW_BLOCK entries, the class found by comparing a uniform with the row's cumulative mix."""
    cum = np.cumsum(mix, axis=1)
    cum /= cum[:, -1:]
    sizes = np.asarray(sizes, dtype=np.int64)
    owner = np.repeat(np.arange(len(sizes)), sizes)
    picked = np.empty(len(owner), np.int64)
    for start in range(0, len(owner), DRAW_BLOCK):
        rows = owner[start:start + DRAW_BLOCK]
        u = rng.random(len(rows))
        cls = np.zeros(len(rows), np.int64)
        for c in range(cum.shape[1] - 1):
            cls += u >= cum[rows, c]
        picked[start:start + DRAW_BLOCK] = _pick(order, starts, class_sizes, cls, rng)
    return DeviceSamples(picked, sizes, True)


# Entries per block of _draw_by_mix (bounds its temporaries; the draws depend on it).
DRAW_BLOCK = 1 << 22


def _iid_drawn(num_samples: int, num_devices: int, m: int,
               rng: np.random.Generator) -> DeviceSamples:
    """Every device draws m samples uniformly from the whole set."""
    return DeviceSamples(rng.integers(0, num_samples, size=num_devices * m, dtype=np.int64),
                         np.full(num_devices, m, np.int64), True)


def _outgrown(num_devices: int, available: int, need_each: int,
              samples_per_device: int | None) -> bool:
    """Whether the scheme draws with replacement: m given, or the split would leave a device
    fewer than ``need_each`` samples (at least one device and one sample: else the split's own
    errors)."""
    if num_devices < 1 or available < 1:
        return False
    return samples_per_device is not None or num_devices * need_each > available


# ---- i.i.d. -------------------------------------------------------------------------------------
def partition_iid(num_samples: int, num_devices: int,
                  rng: np.random.Generator) -> DeviceSamples:
    """Shuffle, then cut into ``num_devices`` equal shards (sizes differ by at most 1).

    This is seed 002's "randomly and equally distributed" split (Sec. V).
    """
    if num_devices < 1:
        raise UserError(f"population.num_devices must be at least 1, got {num_devices}")
    if num_devices > num_samples:
        raise UserError(f"population.num_devices={num_devices} exceeds the {num_samples} training "
                        "samples, so some devices would get no data; use fewer devices or more "
                        "data (data.max_train_samples, a larger dataset)")
    order = rng.permutation(num_samples).astype(np.int64)
    sizes = np.full(num_devices, num_samples // num_devices, np.int64)
    sizes[: num_samples % num_devices] += 1  # as np.array_split
    return DeviceSamples(order, sizes)


def _iid(labels: np.ndarray, num_devices: int, rng: np.random.Generator, *,
         samples_per_device: int | None = None) -> DeviceSamples:
    """The split (``partition_iid``), or with replacement: m uniform draws per device."""
    if _outgrown(num_devices, len(labels), 1, samples_per_device):
        m = drawn_count(samples_per_device, "iid", {})
        return _iid_drawn(len(labels), num_devices, m, rng)
    return partition_iid(len(labels), num_devices, rng)


# ---- Dirichlet label skew -----------------------------------------------------------------------
def _split_counts(proportions: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """[C, N] integer counts: row c cuts totals[c] at floor(cumsum(proportions[c]) * totals[c])."""
    cuts = np.floor(np.cumsum(proportions, axis=1) * totals[:, None]).astype(np.int64)
    cuts[:, -1] = totals  # cumsum may end at 1 - 1e-16
    return np.diff(cuts, axis=1, prepend=0)


def _top_up(counts: np.ndarray, min_samples: int) -> np.ndarray:
    """Move samples from the largest device to each device below ``min_samples``, taking from the
    donor's most frequent class, until every device holds ``min_samples`` [C, N] (in place).

    The largest device (the first of equal ones, as np.argmax) comes from the devices ranked
    once by size and a heap of those whose size changed since, so a move costs O(log N), not a
    scan of all N devices."""
    sizes = counts.sum(axis=0)
    short = np.flatnonzero(sizes < min_samples)
    if not len(short):
        return counts
    ranked = np.lexsort((np.arange(len(sizes)), -sizes)).tolist()  # by (-size, device)
    changed: set[int] = set()
    heap: list[tuple[int, int]] = []  # (-size, device) after a change; stale entries skipped
    position = 0

    def largest() -> int:
        nonlocal position
        while heap and -heap[0][0] != sizes[heap[0][1]]:
            heapq.heappop(heap)
        while ranked[position] in changed:
            position += 1
        top = ranked[position]
        if heap and heap[0] < (-int(sizes[top]), top):
            return heap[0][1]
        return top

    for device in short.tolist():
        while sizes[device] < min_samples:
            donor = largest()  # > min_samples while anyone is short (N m <= n)
            cls = int(np.argmax(counts[:, donor]))
            move = min(min_samples - sizes[device], sizes[donor] - min_samples,
                       counts[cls, donor])
            counts[cls, donor] -= move
            counts[cls, device] += move
            sizes[donor] -= move
            sizes[device] += move
            for changed_device in (donor, device):
                changed.add(changed_device)
                heapq.heappush(heap, (-int(sizes[changed_device]), changed_device))
    return counts


def dirichlet(labels: np.ndarray, num_devices: int, rng: np.random.Generator, *,
              alpha: float = DEFAULT_ALPHA, min_samples: int = DEFAULT_MIN_SAMPLES,
              samples_per_device: int | None = None) -> DeviceSamples:
    """Label skew by Dirichlet proportions: for each class c, p_c ~ Dir(alpha * 1_N) and device j
    gets a fraction p_c[j] of class c's samples (all samples are assigned).

    Dirichlet-distributed client label mixes for FL are from Hsu, Qi and Brown 2019, "Measuring
    the Effects of Non-Identical Data Distribution for Federated Visual Classification"
    (arXiv:1909.06335, Sec. 3); this per-class form is Li et al. 2022, "Federated Learning on
    Non-IID Data Silos: An Experimental Study" (ICDE, Sec. III-A, "distribution-based label
    imbalance"). Large alpha gives i.i.d.-like devices, small alpha one or two classes each.
    Every device gets at least ``min_samples``: up to DIRICHLET_MAX_DRAWS draws are tried (as
    Li et al.'s code redraws); if none qualifies, samples are moved from the largest device to
    the short ones, the donor's most frequent class first.

    With replacement [D] (N min_samples > n, or ``samples_per_device`` given): device j draws m
    samples, each of class c with probability proportional to n_c D_jc, D_j ~ Dir(alpha 1_C),
    then uniformly among class c's samples. This is the split's own label mix for large N: p_c[j]
    = G_cj / sum_k G_ck with G_cj ~ Gamma(alpha) i.i.d., and sum_k G_ck -> N alpha, so device j's
    count of class c tends to n_c G_cj / (N alpha), proportional to n_c G_cj, whose
    normalisation over c is n_c D_jc; the size, random in the split, is m here.
    """
    _check_positive(alpha, "partition.alpha")
    _check_positive(min_samples, "partition.min_samples", integer=True)
    if _outgrown(num_devices, len(labels), min_samples, samples_per_device):
        m = drawn_count(samples_per_device, "dirichlet", {"min_samples": min_samples})
        order, class_sizes = _by_class(labels, rng)
        starts = np.cumsum(class_sizes) - class_sizes
        present = np.flatnonzero(class_sizes)
        weights = rng.dirichlet(np.full(len(present), float(alpha)), num_devices) \
            * class_sizes[present]
        return _draw_by_mix(order, starts[present], class_sizes[present], weights,
                            np.full(num_devices, m), rng)
    _check_devices(num_devices, len(labels), min_samples,
                   key="partition.min_samples / population.num_devices")
    order, class_sizes = _by_class(labels, rng)
    present = class_sizes > 0
    totals = class_sizes[present]
    for _ in range(DIRICHLET_MAX_DRAWS):
        counts = _split_counts(rng.dirichlet(np.full(num_devices, float(alpha)), len(totals)),
                               totals)
        if counts.sum(axis=0).min() >= min_samples:
            break
    else:
        counts = _top_up(counts, min_samples)
    # order lists class after class, so device ids repeated by counts (class-major) line up.
    owner = np.repeat(np.tile(np.arange(num_devices), len(totals)), counts.ravel())
    return _group(order, owner, num_devices, rng)


# ---- per-device Dirichlet label mixes --------------------------------------------------------------
def _largest_remainder(shares: np.ndarray, total: int) -> np.ndarray:
    """Integers summing to ``total``, floor(shares) plus one for the largest remainders."""
    base = np.floor(shares).astype(np.int64)
    extra = total - int(base.sum())
    if extra > 0:
        base[np.argsort(-(shares - base), kind="stable")[:extra]] += 1
    return base


def client_dirichlet(labels: np.ndarray, num_devices: int, rng: np.random.Generator, *,
                     alpha: float = DEFAULT_ALPHA, min_samples: int = DEFAULT_MIN_SAMPLES,
                     rare_classes: list[int] | tuple = (),
                     rare_weight: float = DEFAULT_RARE_WEIGHT,
                     size_median: float = DEFAULT_SIZE_MEDIAN,
                     size_sigma: float = DEFAULT_SIZE_SIGMA) -> DeviceSamples:
    """Label skew drawn per device, with unequal sizes and optional rare classes: the split of
    seed 003's prototype experiment (fgdro.md Sec. 5), after Shen et al. 2021's imbalanced
    CIFAR-10 (seed 003, App. G).

    Device i's label mix pi_i ~ Dir(alpha 1_C); the entries of ``rare_classes`` are multiplied by
    ``rare_weight`` and pi_i renormalised (fgdro.md: classes 5-9 at 20 %); its size
    m_i = max(min_samples, floor(LogNormal(ln size_median, size_sigma))); its class counts are
    a Multinomial(m_i, pi_i) draw, filled with samples of those classes without replacement.
    Where the devices together ask for more samples of a class than the training set holds,
    their counts of that class are scaled down in proportion (largest remainder), so sizes may
    end below m_i. A subset of the training set is assigned.

    With replacement [D]: where that scaling would leave a device without samples (the
    population outgrows the training set), every device instead draws its m_i samples in full,
    each of class c with probability pi_i(c) (a Multinomial(m_i, pi_i) in random order) and
    uniformly among class c's samples.
    """
    _check_positive(alpha, "partition.alpha")
    _check_positive(min_samples, "partition.min_samples", integer=True)
    _check_positive(rare_weight, "partition.rare_weight")
    _check_positive(size_median, "partition.size_median")
    if not (size_sigma >= 0 and np.isfinite(size_sigma)):
        raise UserError(f"partition.size_sigma must be a finite number >= 0, got {size_sigma!r}")
    if num_devices < 1:
        raise UserError(f"population.num_devices must be at least 1, got {num_devices}")
    order, class_sizes = _by_class(labels, rng)
    classes = np.flatnonzero(class_sizes)
    unknown = sorted({int(c) for c in rare_classes} - set(classes.tolist()))
    if unknown:
        raise UserError(f"partition.rare_classes lists {unknown}, which the training set does not "
                        f"hold; its labels are {classes.tolist()}")
    mix = rng.dirichlet(np.full(len(classes), float(alpha)), num_devices)  # [N, C]
    mix[:, np.isin(classes, list(rare_classes))] *= rare_weight
    mix /= mix.sum(axis=1, keepdims=True)
    # LogNormal(ln median, sigma) = median exp(sigma Z)
    drawn = np.floor(size_median * np.exp(size_sigma * rng.standard_normal(num_devices)))
    sizes = np.maximum(min_samples, drawn).astype(np.int64)
    # one Multinomial(m_i, pi_i) per device, in device order (the draws of a loop over devices)
    counts = rng.multinomial(sizes, mix / mix.sum(axis=1, keepdims=True)).T.copy()  # [C, N]
    available = class_sizes[classes]
    for c in np.flatnonzero(counts.sum(axis=1) > available):  # [C, N]: too few samples of c
        counts[c] = _largest_remainder(counts[c] * available[c] / counts[c].sum(), available[c])
    if len(labels) and (counts.sum(axis=0) == 0).any():  # outgrown: every device draws m_i
        starts = np.cumsum(class_sizes) - class_sizes
        return _draw_by_mix(order, starts[classes], available, mix, sizes, rng)
    empty = np.flatnonzero(counts.sum(axis=0) == 0)
    if len(empty):
        raise UserError(f"partition: device {int(empty[0])} got no samples (its classes ran out); "
                        "use more data, fewer devices (population.num_devices) or a smaller "
                        "partition.size_median")
    starts = np.concatenate([[0], np.cumsum(class_sizes)])[classes]  # each class's block
    taken = [order[start:start + total] for start, total in zip(starts, counts.sum(axis=1))]
    owner = np.concatenate([np.repeat(np.arange(num_devices), row) for row in counts])
    return _group(np.concatenate(taken), owner, num_devices, rng)


# ---- shards ---------------------------------------------------------------------------------------
def shards(labels: np.ndarray, num_devices: int, rng: np.random.Generator, *,
           shards_per_device: int = DEFAULT_SHARDS_PER_DEVICE,
           samples_per_device: int | None = None) -> DeviceSamples:
    """Sort by label, cut into num_devices * shards_per_device shards of equal size (differing by
    at most 1), give each device shards_per_device of them at random.

    McMahan et al. 2017, "Communication-Efficient Learning of Deep Networks from Decentralized
    Data" (AISTATS), Sec. 3: MNIST in 200 shards of 300, 2 per client, so most clients hold
    two digits. All samples are assigned.

    With replacement [D] (more shards than samples, or ``samples_per_device`` given): device j
    holds shards_per_device shards of the label-sorted set whose sizes split m as evenly as
    possible, each a window of consecutive samples at a uniformly drawn position, independently
    of the other devices.
    """
    _check_positive(shards_per_device, "partition.shards_per_device", integer=True)
    if _outgrown(num_devices, len(labels), shards_per_device, samples_per_device):
        m = drawn_count(samples_per_device, "shards", {"shards_per_device": shards_per_device})
        return _shards_drawn(labels, num_devices, rng, shards_per_device, m)
    if num_devices < 1:
        raise UserError(f"population.num_devices must be at least 1, got {num_devices}")
    count = num_devices * shards_per_device
    if count > len(labels):
        raise UserError(f"partition.shards_per_device: {num_devices} devices x "
                        f"{shards_per_device} shards = {count} shards exceeds the {len(labels)} "
                        "training samples, so some shards would be empty; use fewer shards per "
                        "device, fewer devices (population.num_devices) or more data")
    order, _ = _by_class(labels, rng)
    shard_sizes = np.full(count, len(labels) // count)
    shard_sizes[: len(labels) % count] += 1  # as np.array_split
    shard_of_sample = np.repeat(np.arange(count), shard_sizes)
    device_of_shard = np.empty(count, np.int64)
    device_of_shard[rng.permutation(count)] = np.repeat(np.arange(num_devices), shards_per_device)
    return _group(order, device_of_shard[shard_of_sample], num_devices, rng)


def _shards_drawn(labels: np.ndarray, num_devices: int, rng: np.random.Generator, k: int,
                  m: int) -> DeviceSamples:
    """k windows of the label-sorted set per device, sizes m // k (+1 for the first m % k)."""
    n = len(labels)
    sizes = np.full(k, m // k, np.int64)
    sizes[: m % k] += 1
    if sizes[0] > n:
        raise UserError(f"partition.samples_per_device={m}: shards of {sizes[0]} samples exceed "
                        f"the {n} training samples; use at most {n * k} samples per device")
    order, _ = _by_class(labels, rng)
    shard_of_slot = np.repeat(np.arange(k), sizes)  # [m]
    offset_of_slot = np.arange(m) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    starts = rng.integers(0, n - sizes + 1, size=(num_devices, k))
    picked = order[starts[:, shard_of_slot] + offset_of_slot]  # [N, m]
    # random order within each device: no device's set sorted by class
    picked = np.take_along_axis(picked, np.argsort(rng.random(picked.shape), axis=1), axis=1)
    return DeviceSamples(picked.ravel(), np.full(num_devices, m, np.int64), True)


# ---- quantity skew ------------------------------------------------------------------------------
def quantity_skew(labels: np.ndarray, num_devices: int, rng: np.random.Generator, *,
                  beta: float = DEFAULT_BETA, min_samples: int = DEFAULT_MIN_SAMPLES,
                  samples_per_device: int | None = None) -> DeviceSamples:
    """I.i.d. labels, skewed sizes: q ~ Dir(beta * 1_N); every device first gets min_samples,
    the remaining n - N * min_samples shuffled samples are cut in proportions q.

    Li et al. 2022, "Federated Learning on Non-IID Data Silos: An Experimental Study" (ICDE,
    Sec. III-C, "quantity skew"); they redraw q until the smallest device is large enough, the
    guaranteed floor here needs no redraw. All samples are assigned.

    With replacement [D] (N min_samples > n, or ``samples_per_device`` = m given): the same
    sizes for N m samples in all (min_samples each, the other N (m - min_samples) cut in
    proportions q), every sample drawn uniformly from the whole set.
    """
    _check_positive(beta, "partition.beta")
    _check_positive(min_samples, "partition.min_samples", integer=True)
    n = len(labels)
    if _outgrown(num_devices, n, min_samples, samples_per_device):
        m = drawn_count(samples_per_device, "quantity-skew", {"min_samples": min_samples})
        q = rng.dirichlet(np.full(num_devices, float(beta)))
        sizes = min_samples + _split_counts(q[None, :],
                                            np.array([num_devices * (m - min_samples)]))[0]
        return DeviceSamples(rng.integers(0, n, size=int(sizes.sum()), dtype=np.int64), sizes,
                             True)
    _check_devices(num_devices, n, min_samples,
                   key="partition.min_samples / population.num_devices")
    q = rng.dirichlet(np.full(num_devices, float(beta)))
    sizes = min_samples + _split_counts(q[None, :], np.array([n - num_devices * min_samples]))[0]
    return DeviceSamples(rng.permutation(n).astype(np.int64), sizes)


# ---- #C = k label skew --------------------------------------------------------------------------
def label_skew(labels: np.ndarray, num_devices: int, rng: np.random.Generator, *,
               classes_per_device: int = DEFAULT_CLASSES_PER_DEVICE,
               samples_per_device: int | None = None) -> DeviceSamples:
    """Each device holds exactly k = classes_per_device classes; the samples of a class are split
    evenly (sizes differing by at most 1) among the devices that hold it.

    Li et al. 2022, "Federated Learning on Non-IID Data Silos: An Experimental Study" (ICDE,
    Sec. III-A, "quantity-based label imbalance", #C = k). As in their code, device j's first
    class is the j-th present class (mod C), so every class is used when N >= C, and the other
    k - 1 are drawn at random. A class held by no device is left out (a subset is assigned).

    With replacement [D] (a class has fewer samples than devices holding it, or
    ``samples_per_device`` = m given): the same classes per device; device j draws m // k
    samples of each of its classes (one more of its first m % k), uniformly among the class's
    samples.
    """
    _check_positive(classes_per_device, "partition.classes_per_device", integer=True)
    if num_devices < 1:
        raise UserError(f"population.num_devices must be at least 1, got {num_devices}")
    if samples_per_device is not None:  # checked before anything is drawn
        drawn_count(samples_per_device, "label-skew", {"classes_per_device": classes_per_device})
    order, class_sizes = _by_class(labels, rng)
    classes = np.flatnonzero(class_sizes)
    k, num_classes = classes_per_device, len(classes)
    if k > num_classes:
        raise UserError(f"partition.classes_per_device={k} exceeds the {num_classes} classes in "
                        f"the training set; use at most {num_classes}")
    keys = rng.random((num_devices, num_classes))
    keys[np.arange(num_devices), np.arange(num_devices) % num_classes] = -1.0  # first class
    chosen = np.argsort(keys, axis=1)[:, :k]  # [N, k] each device's classes, its first first
    held = np.zeros((num_classes, num_devices), bool)  # [C, N]
    held[chosen, np.arange(num_devices)[:, None]] = True
    holders = held.sum(axis=1)
    short = np.flatnonzero(holders > class_sizes[classes])
    if samples_per_device is not None or len(short):
        m = samples_per_device if samples_per_device is not None else k
        # slot t of every device: its class t mod k (so its first m % k classes get one more)
        cls = chosen[:, np.arange(m) % k].ravel()
        starts = np.cumsum(class_sizes) - class_sizes
        picked = _pick(order, starts[classes], class_sizes[classes], cls, rng)
        return DeviceSamples(picked, np.full(num_devices, m, np.int64), True)
    # Per class, counts of an even split over its holders, in device order.
    base, extra = np.divmod(class_sizes[classes], np.maximum(holders, 1))
    rank = np.cumsum(held, axis=1) - 1  # 0-based position of each holder within its class
    counts = np.where(held, base[:, None] + (rank < extra[:, None]), 0)
    counts_full = np.zeros((len(class_sizes), num_devices), np.int64)
    counts_full[classes] = counts
    owner_all = np.repeat(np.tile(np.arange(num_devices), len(class_sizes)), counts_full.ravel())
    # Classes held by nobody keep no owner: drop their samples from ``order``.
    keep = np.isin(labels[order], classes[holders > 0])
    return _group(order[keep], owner_all, num_devices, rng)


PARTITIONERS: dict[str, Partitioner] = {
    "iid": _iid, "dirichlet": dirichlet, "shards": shards, "quantity-skew": quantity_skew,
    "label-skew": label_skew, "client-dirichlet": client_dirichlet,
}
# The keyword parameters each scheme reads (the scenario schema refuses any other).
SCHEME_PARAMS: dict[str, tuple[str, ...]] = {
    "iid": ("samples_per_device",),
    "dirichlet": ("alpha", "min_samples", "samples_per_device"),
    "shards": ("shards_per_device", "samples_per_device"),
    "quantity-skew": ("beta", "min_samples", "samples_per_device"),
    "label-skew": ("classes_per_device", "samples_per_device"),
    "client-dirichlet": ("alpha", "min_samples", "rare_classes", "rare_weight", "size_median",
                         "size_sigma"),
}
PARAM_DEFAULTS: dict[str, float | int | list[int]] = {
    "alpha": DEFAULT_ALPHA, "shards_per_device": DEFAULT_SHARDS_PER_DEVICE, "beta": DEFAULT_BETA,
    "classes_per_device": DEFAULT_CLASSES_PER_DEVICE, "min_samples": DEFAULT_MIN_SAMPLES,
    "rare_classes": [], "rare_weight": DEFAULT_RARE_WEIGHT, "size_median": DEFAULT_SIZE_MEDIAN,
    "size_sigma": DEFAULT_SIZE_SIGMA,
}
# Parameters without a default: absent (None) unless given, and then left out of params().
OPTIONAL_PARAMS = ("samples_per_device",)


def partition(scheme: str, labels: np.ndarray, num_devices: int, rng: np.random.Generator,
              **params) -> DeviceSamples:
    """Indices into the training set for each device, by the named ``scheme`` and its
    parameters (see SCHEME_PARAMS)."""
    if scheme not in PARTITIONERS:
        raise UserError(f"partition.scheme '{scheme}' is unknown; choose one of "
                        f"{', '.join(sorted(PARTITIONERS))}")
    unread = sorted(set(params) - set(SCHEME_PARAMS[scheme]))
    if unread:
        reads = ", ".join(SCHEME_PARAMS[scheme]) or "no parameters"
        raise UserError(f"partition.{unread[0]} is not read by scheme '{scheme}' (it reads "
                        f"{reads}); remove it or choose a scheme that reads it")
    params = {k: v for k, v in params.items() if not (k in OPTIONAL_PARAMS and v is None)}
    labels = np.asarray(labels)
    if scheme == "iid":  # reads only len(labels): kept exactly as it always was
        return _iid(labels, num_devices, rng, **params)
    if len(labels) and (not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0):
        raise UserError(f"partition.scheme '{scheme}' needs class labels, but the training "
                        "labels are not non-negative integers; use scheme: iid")
    return PARTITIONERS[scheme](labels.astype(np.int64, copy=False), num_devices, rng, **params)


# ---- what the split looks like ------------------------------------------------------------------
def label_counts(labels: np.ndarray, samples, num_classes: int) -> np.ndarray:
    """[N, C] int64: how many samples of each class every device holds (``samples``: a
    DeviceSamples, or one index array per device)."""
    samples = DeviceSamples.coerce(samples)
    labels = np.asarray(labels, dtype=np.int64)
    num_devices = len(samples)
    flat = labels[samples.order]
    if flat.size and (flat.min() < 0 or flat.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes}), got {flat.min()}..{flat.max()}")
    return np.bincount(samples.owner() * num_classes + flat,
                       minlength=num_devices * num_classes).reshape(num_devices, num_classes)


def mean_tv_distance(counts: np.ndarray) -> float:
    """Mean over devices of the total-variation distance 0.5 * sum_c |p_j(c) - p(c)| between a
    device's label distribution p_j and the federation's p (all devices' samples together)
    [0 = every device i.i.d.-like, -> 1 = disjoint labels]."""
    counts = np.asarray(counts)
    if not len(counts):
        return 0.0
    overall = counts.sum(axis=0).astype(float) / max(float(counts.sum()), 1)
    tv = np.empty(len(counts))
    for start in range(0, len(counts), TV_BLOCK):  # blocks of devices: small temporaries
        block = counts[start:start + TV_BLOCK].astype(float)
        device = block / np.maximum(block.sum(axis=1, keepdims=True), 1)
        tv[start:start + TV_BLOCK] = 0.5 * np.abs(device - overall).sum(axis=1)
    return float(np.mean(tv))


# Devices per block of mean_tv_distance's arithmetic (the values do not depend on it).
TV_BLOCK = 65536
