"""Splitting the training set over devices: each scheme returns one index array per device.

Every partitioner in PARTITIONERS takes (labels [n], num_devices, rng, **params) and returns
``num_devices`` int64 index arrays into the training set: disjoint, each non-empty, together the
whole set or (label-skew, client-dirichlet) a subset of it. ``SCHEME_PARAMS`` says which keyword
parameters each scheme reads; the scenario schema refuses the others. Errors name the scenario key
and the fix.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from wirelessfl.errors import UserError

Partitioner = Callable[..., list[np.ndarray]]

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
           rng: np.random.Generator) -> list[np.ndarray]:
    """Index arrays per device from (sample index, owning device) pairs, in random order within
    each device (so no device's shard is sorted by class)."""
    shuffle = rng.permutation(len(indices))
    indices, owner = indices[shuffle], owner[shuffle]
    by_owner = np.argsort(owner, kind="stable")
    sizes = np.bincount(owner, minlength=num_devices)
    return np.split(indices[by_owner].astype(np.int64), np.cumsum(sizes)[:-1])


def _by_class(labels: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """All sample indices grouped by class (random order inside a class) and the class sizes."""
    order = rng.permutation(len(labels))
    order = order[np.argsort(labels[order], kind="stable")]
    return order, np.bincount(labels, minlength=int(labels.max()) + 1 if len(labels) else 0)


# ---- i.i.d. -------------------------------------------------------------------------------------
def partition_iid(num_samples: int, num_devices: int,
                  rng: np.random.Generator) -> list[np.ndarray]:
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
    return np.array_split(order, num_devices)


def _iid(labels: np.ndarray, num_devices: int, rng: np.random.Generator) -> list[np.ndarray]:
    return partition_iid(len(labels), num_devices, rng)


# ---- Dirichlet label skew -----------------------------------------------------------------------
def _split_counts(proportions: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """[C, N] integer counts: row c cuts totals[c] at floor(cumsum(proportions[c]) * totals[c])."""
    cuts = np.floor(np.cumsum(proportions, axis=1) * totals[:, None]).astype(np.int64)
    cuts[:, -1] = totals  # cumsum may end at 1 - 1e-16
    return np.diff(cuts, axis=1, prepend=0)


def _top_up(counts: np.ndarray, min_samples: int) -> np.ndarray:
    """Move samples from the largest device to each device below ``min_samples``, taking from the
    donor's most frequent class, until every device holds ``min_samples`` [C, N] (in place)."""
    sizes = counts.sum(axis=0)
    for device in np.flatnonzero(sizes < min_samples):
        while sizes[device] < min_samples:
            donor = int(np.argmax(sizes))  # > min_samples while anyone is short (N m <= n)
            cls = int(np.argmax(counts[:, donor]))
            move = min(min_samples - sizes[device], sizes[donor] - min_samples,
                       counts[cls, donor])
            counts[cls, donor] -= move
            counts[cls, device] += move
            sizes[donor] -= move
            sizes[device] += move
    return counts


def dirichlet(labels: np.ndarray, num_devices: int, rng: np.random.Generator, *,
              alpha: float = DEFAULT_ALPHA,
              min_samples: int = DEFAULT_MIN_SAMPLES) -> list[np.ndarray]:
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
    """
    _check_positive(alpha, "partition.alpha")
    _check_positive(min_samples, "partition.min_samples", integer=True)
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
                     size_sigma: float = DEFAULT_SIZE_SIGMA) -> list[np.ndarray]:
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
    counts = np.stack([rng.multinomial(m, p / p.sum()) for m, p in zip(sizes, mix)], axis=1)
    available = class_sizes[classes]
    for c in np.flatnonzero(counts.sum(axis=1) > available):  # [C, N]: too few samples of c
        counts[c] = _largest_remainder(counts[c] * available[c] / counts[c].sum(), available[c])
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
           shards_per_device: int = DEFAULT_SHARDS_PER_DEVICE) -> list[np.ndarray]:
    """Sort by label, cut into num_devices * shards_per_device shards of equal size (differing by
    at most 1), give each device shards_per_device of them at random.

    McMahan et al. 2017, "Communication-Efficient Learning of Deep Networks from Decentralized
    Data" (AISTATS), Sec. 3: MNIST in 200 shards of 300, 2 per client, so most clients hold
    two digits. All samples are assigned.
    """
    _check_positive(shards_per_device, "partition.shards_per_device", integer=True)
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


# ---- quantity skew ------------------------------------------------------------------------------
def quantity_skew(labels: np.ndarray, num_devices: int, rng: np.random.Generator, *,
                  beta: float = DEFAULT_BETA,
                  min_samples: int = DEFAULT_MIN_SAMPLES) -> list[np.ndarray]:
    """I.i.d. labels, skewed sizes: q ~ Dir(beta * 1_N); every device first gets min_samples,
    the remaining n - N * min_samples shuffled samples are cut in proportions q.

    Li et al. 2022, "Federated Learning on Non-IID Data Silos: An Experimental Study" (ICDE,
    Sec. III-C, "quantity skew"); they redraw q until the smallest device is large enough, the
    guaranteed floor here needs no redraw. All samples are assigned.
    """
    _check_positive(beta, "partition.beta")
    _check_positive(min_samples, "partition.min_samples", integer=True)
    n = len(labels)
    _check_devices(num_devices, n, min_samples,
                   key="partition.min_samples / population.num_devices")
    q = rng.dirichlet(np.full(num_devices, float(beta)))
    sizes = min_samples + _split_counts(q[None, :], np.array([n - num_devices * min_samples]))[0]
    order = rng.permutation(n).astype(np.int64)
    return np.split(order, np.cumsum(sizes)[:-1])


# ---- #C = k label skew --------------------------------------------------------------------------
def label_skew(labels: np.ndarray, num_devices: int, rng: np.random.Generator, *,
               classes_per_device: int = DEFAULT_CLASSES_PER_DEVICE) -> list[np.ndarray]:
    """Each device holds exactly k = classes_per_device classes; the samples of a class are split
    evenly (sizes differing by at most 1) among the devices that hold it.

    Li et al. 2022, "Federated Learning on Non-IID Data Silos: An Experimental Study" (ICDE,
    Sec. III-A, "quantity-based label imbalance", #C = k). As in their code, device j's first
    class is the j-th present class (mod C), so every class is used when N >= C, and the other
    k - 1 are drawn at random. A class held by no device is left out (a subset is assigned).
    """
    _check_positive(classes_per_device, "partition.classes_per_device", integer=True)
    if num_devices < 1:
        raise UserError(f"population.num_devices must be at least 1, got {num_devices}")
    order, class_sizes = _by_class(labels, rng)
    classes = np.flatnonzero(class_sizes)
    k, num_classes = classes_per_device, len(classes)
    if k > num_classes:
        raise UserError(f"partition.classes_per_device={k} exceeds the {num_classes} classes in "
                        f"the training set; use at most {num_classes}")
    keys = rng.random((num_devices, num_classes))
    keys[np.arange(num_devices), np.arange(num_devices) % num_classes] = -1.0  # first class
    held = np.zeros((num_classes, num_devices), bool)  # [C, N]
    held[np.argsort(keys, axis=1)[:, :k], np.arange(num_devices)[:, None]] = True
    holders = held.sum(axis=1)
    short = np.flatnonzero(holders > class_sizes[classes])
    if len(short):
        c = short[0]
        raise UserError(f"partition.classes_per_device={k}: class {classes[c]} has "
                        f"{class_sizes[classes[c]]} samples for {holders[c]} devices holding it, "
                        "so some would get none of it; use fewer devices "
                        "(population.num_devices), fewer classes per device or more data")
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
    "iid": (), "dirichlet": ("alpha", "min_samples"), "shards": ("shards_per_device",),
    "quantity-skew": ("beta", "min_samples"), "label-skew": ("classes_per_device",),
    "client-dirichlet": ("alpha", "min_samples", "rare_classes", "rare_weight", "size_median",
                         "size_sigma"),
}
PARAM_DEFAULTS: dict[str, float | int | list[int]] = {
    "alpha": DEFAULT_ALPHA, "shards_per_device": DEFAULT_SHARDS_PER_DEVICE, "beta": DEFAULT_BETA,
    "classes_per_device": DEFAULT_CLASSES_PER_DEVICE, "min_samples": DEFAULT_MIN_SAMPLES,
    "rare_classes": [], "rare_weight": DEFAULT_RARE_WEIGHT, "size_median": DEFAULT_SIZE_MEDIAN,
    "size_sigma": DEFAULT_SIZE_SIGMA,
}


def partition(scheme: str, labels: np.ndarray, num_devices: int, rng: np.random.Generator,
              **params) -> list[np.ndarray]:
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
    labels = np.asarray(labels)
    if scheme == "iid":  # reads only len(labels): kept exactly as it always was
        return _iid(labels, num_devices, rng)
    if len(labels) and (not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0):
        raise UserError(f"partition.scheme '{scheme}' needs class labels, but the training "
                        "labels are not non-negative integers; use scheme: iid")
    return PARTITIONERS[scheme](labels.astype(np.int64, copy=False), num_devices, rng, **params)


# ---- what the split looks like ------------------------------------------------------------------
def label_counts(labels: np.ndarray, shards: list[np.ndarray], num_classes: int) -> np.ndarray:
    """[N, C] int64: how many samples of each class every device holds."""
    labels = np.asarray(labels, dtype=np.int64)
    sizes = np.array([len(s) for s in shards], np.int64)
    owner = np.repeat(np.arange(len(shards)), sizes)
    flat = labels[np.concatenate(shards).astype(np.int64)] if sizes.sum() else np.zeros(0, int)
    if flat.size and (flat.min() < 0 or flat.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes}), got {flat.min()}..{flat.max()}")
    return np.bincount(owner * num_classes + flat,
                       minlength=len(shards) * num_classes).reshape(len(shards), num_classes)


def mean_tv_distance(counts: np.ndarray) -> float:
    """Mean over devices of the total-variation distance 0.5 * sum_c |p_j(c) - p(c)| between a
    device's label distribution p_j and the federation's p (all devices' samples together)
    [0 = every device i.i.d.-like, -> 1 = disjoint labels]."""
    counts = np.asarray(counts, dtype=float)
    sizes = counts.sum(axis=1, keepdims=True)
    device = counts / np.maximum(sizes, 1)
    overall = counts.sum(axis=0) / max(counts.sum(), 1)
    return float(np.mean(0.5 * np.abs(device - overall).sum(axis=1))) if len(counts) else 0.0
