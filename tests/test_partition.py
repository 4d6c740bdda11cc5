"""Partitioners: i.i.d. (unchanged), Dirichlet, shards, quantity skew, #C = k label skew,
per-device Dirichlet label mixes; the index sets they return (DeviceSamples); the draws with
replacement of populations that outgrow the training set.

Truths are computed here with np.bincount / np.unique on each device's labels, not with the
module's own label_counts (which is itself checked against np.bincount below); the splits
that fit are checked against digests recorded with the code before index sets (commit
a9411f9), the draws with replacement against exact counts, the draws replayed with numpy and
chi-square tests of their label frequencies.
"""

import numpy as np
import pytest

from wirelessfl.errors import UserError
from wirelessfl.learning import partition as part
from wirelessfl.learning.partition import (
    PARTITIONERS,
    SCHEME_PARAMS,
    label_counts,
    mean_tv_distance,
    partition,
    partition_iid,
)


def _labels(rng_seed=0, n=3000, classes=10):
    """Unequal class sizes, shuffled."""
    rng = np.random.default_rng(rng_seed)
    weights = np.linspace(1.0, 2.0, classes)
    return rng.choice(classes, size=n, p=weights / weights.sum())


def _tv(counts_row, overall):
    p = counts_row / counts_row.sum()
    return 0.5 * np.abs(p - overall).sum()


SCHEMES = [
    ("iid", {}),
    ("dirichlet", {"alpha": 0.3}),
    ("dirichlet", {"alpha": 0.05, "min_samples": 5}),
    ("shards", {"shards_per_device": 2}),
    ("quantity-skew", {"beta": 0.5, "min_samples": 3}),
    ("label-skew", {"classes_per_device": 3}),
    ("client-dirichlet", {"alpha": 0.3, "min_samples": 10, "rare_classes": [5, 6],
                          "size_median": 40.0}),
]


# ---- i.i.d. (seed 002) --------------------------------------------------------------------------
@pytest.mark.parametrize("n, k", [(100, 7), (50, 50), (1347, 50), (10, 1)])
def test_iid_shards_disjoint_complete_balanced(n, k):
    shards = partition_iid(n, k, np.random.default_rng(0))
    assert len(shards) == k
    together = np.concatenate(shards)
    assert together.dtype == np.int64
    assert sorted(together.tolist()) == list(range(n))  # every sample exactly once
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


def test_iid_deterministic_for_a_seed():
    a = partition_iid(200, 9, np.random.default_rng(42))
    b = partition_iid(200, 9, np.random.default_rng(42))
    c = partition_iid(200, 9, np.random.default_rng(43))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_iid_output_unchanged():
    """Recorded results depend on the i.i.d. split: same seed, same indices as ever."""
    got = partition("iid", np.zeros(10, np.int64), 3, np.random.default_rng(0))
    expected = np.random.default_rng(0).permutation(10)  # shuffle, then cut 4 / 3 / 3
    assert [s.tolist() for s in got] == [expected[:4].tolist(), expected[4:7].tolist(),
                                         expected[7:].tolist()]


def test_iid_shuffles():
    shards = partition_iid(1000, 2, np.random.default_rng(1))
    assert not np.array_equal(shards[0], np.arange(500))


def test_too_many_devices():
    with pytest.raises(UserError, match=r"num_devices=11 .* 10 training samples.*fewer devices"):
        partition_iid(10, 11, np.random.default_rng(0))


def test_registry_dispatch_and_unknown_scheme():
    labels = np.arange(30) % 3
    shards = partition("iid", labels, 4, np.random.default_rng(5))
    direct = partition_iid(30, 4, np.random.default_rng(5))
    assert all(np.array_equal(x, y) for x, y in zip(shards, direct))
    assert set(PARTITIONERS) == set(SCHEME_PARAMS) == {
        "iid", "dirichlet", "shards", "quantity-skew", "label-skew", "client-dirichlet"}
    with pytest.raises(UserError, match="partition.scheme 'pathological' is unknown; choose one "
                                        "of client-dirichlet, dirichlet, iid, label-skew, quantity-skew, "
                                        "shards"):
        partition("pathological", labels, 4, np.random.default_rng(5))


# ---- every scheme -------------------------------------------------------------------------------
@pytest.mark.parametrize("scheme, params", SCHEMES)
def test_disjoint_nonempty_subset(scheme, params):
    labels = _labels()
    shards = partition(scheme, labels, 25, np.random.default_rng(7), **params)
    assert len(shards) == 25
    together = np.concatenate(shards)
    assert together.dtype == np.int64
    assert len(np.unique(together)) == len(together)  # no sample on two devices
    assert together.min() >= 0 and together.max() < len(labels)
    assert min(len(s) for s in shards) >= params.get("min_samples", 1)
    # 25 devices >= 10 classes: label-skew uses every class too, so every scheme but
    # client-dirichlet (device sizes drawn, a subset) assigns all.
    if scheme != "client-dirichlet":
        assert len(together) == len(labels)


@pytest.mark.parametrize("scheme, params", SCHEMES)
def test_deterministic_for_a_seed(scheme, params):
    labels = _labels()
    a = partition(scheme, labels, 12, np.random.default_rng(3), **params)
    b = partition(scheme, labels, 12, np.random.default_rng(3), **params)
    c = partition(scheme, labels, 12, np.random.default_rng(4), **params)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


# ---- Dirichlet ----------------------------------------------------------------------------------
def test_dirichlet_large_alpha_is_iid_like():
    labels = np.repeat(np.arange(10), 2000)
    shards = partition("dirichlet", labels, 10, np.random.default_rng(0), alpha=1000.0)
    for s in shards:
        assert len(s) > 1500
        assert _tv(np.bincount(labels[s], minlength=10), np.full(10, 0.1)) < 0.1


def test_dirichlet_small_alpha_one_class_dominates():
    labels = np.repeat(np.arange(10), 400)
    shards = partition("dirichlet", labels, 20, np.random.default_rng(0), alpha=0.05)
    top = np.array([np.bincount(labels[s], minlength=10).max() / len(s) for s in shards])
    assert np.mean(top > 0.5) >= 0.7  # most devices: one class is the majority
    assert np.median(top) > 0.7  # against about 0.1 for an i.i.d. split of 10 classes


def test_dirichlet_min_samples_by_moving_when_redraws_fail(monkeypatch):
    monkeypatch.setattr(part, "DIRICHLET_MAX_DRAWS", 1)
    labels = np.repeat(np.arange(5), 200)
    # alpha = 0.01: each class goes to about one of 100 devices, so most start empty.
    shards = partition("dirichlet", labels, 100, np.random.default_rng(2), alpha=0.01,
                       min_samples=4)
    assert min(len(s) for s in shards) >= 4
    assert sum(len(s) for s in shards) == 1000
    assert len(np.unique(np.concatenate(shards))) == 1000


# ---- shards (McMahan et al. 2017) ---------------------------------------------------------------
def test_shards_two_labels_per_device_when_shards_fit_classes():
    labels = np.random.default_rng(0).permutation(np.repeat(np.arange(10), 600))
    # 20 devices x 2 shards = 40 shards of 150; 150 divides 600, so no shard spans two labels.
    shards = partition("shards", labels, 20, np.random.default_rng(1), shards_per_device=2)
    assert all(len(s) == 300 for s in shards)
    assert all(len(np.unique(labels[s])) <= 2 for s in shards)
    assert any(len(np.unique(labels[s])) == 2 for s in shards)


def test_shards_without_samples():
    with pytest.raises(UserError, match=r"partition.shards_per_device: 6 devices x 2 shards = 12 "
                                        r"shards exceeds the 0 training samples.*fewer shards"):
        partition("shards", np.zeros(0, np.int64), 6, np.random.default_rng(0),
                  shards_per_device=2)


def _sorted_by_label(labels, rng):
    """The partitioners' first draw: a permutation, stably sorted by label."""
    order = rng.permutation(len(labels))
    return order[np.argsort(labels[order], kind="stable")]


def test_shards_with_more_shards_than_samples_draw_windows_of_the_sorted_set():
    """11 devices x 2 shards of 20 samples, or 500 devices with samples_per_device = 6: each
    device draws 2 windows (of 3 consecutive
    samples for m = 6) of the label-sorted set at uniform positions, in random order:
    replayed here with numpy from the same seed."""
    labels = np.repeat(np.arange(4), 5)[np.random.default_rng(3).permutation(20)]
    fits = partition("shards", labels, 10, np.random.default_rng(0), shards_per_device=2)
    assert not fits.with_replacement and len(np.unique(fits.order)) == 20  # 20 shards of 1
    drawn = partition("shards", labels, 11, np.random.default_rng(0), shards_per_device=2)
    assert drawn.with_replacement and drawn.sizes.tolist() == [2] * 11  # m = shards_per_device
    many = partition("shards", labels, 500, np.random.default_rng(1), shards_per_device=2,
                     samples_per_device=6)
    assert many.with_replacement and many.sizes.tolist() == [6] * 500
    rng = np.random.default_rng(1)
    order = _sorted_by_label(labels, rng)
    starts = rng.integers(0, 18, size=(500, 2))  # windows of 3 in 20 samples
    windows = order[np.repeat(starts, 3, axis=1) + np.tile(np.arange(3), 2)]
    shuffled = np.take_along_axis(windows, np.argsort(rng.random((500, 6)), axis=1), axis=1)
    assert np.array_equal(many.order, shuffled.ravel())
    assert max(len(np.unique(labels[s])) for s in many) <= 4  # a window spans <= 2 labels
    with pytest.raises(UserError, match=r"samples_per_device=50: shards of 25 samples exceed "
                                        r"the 20 training samples"):
        partition("shards", labels, 6, np.random.default_rng(0), samples_per_device=50)


# ---- quantity skew (Li et al. 2022) -------------------------------------------------------------
def test_quantity_skew_sizes_vary_labels_stay_iid():
    labels = np.random.default_rng(0).integers(0, 10, 20000)
    overall = np.bincount(labels, minlength=10) / len(labels)
    shards = partition("quantity-skew", labels, 20, np.random.default_rng(1), beta=0.5,
                       min_samples=10)
    sizes = np.array([len(s) for s in shards])
    iid_sizes = np.array([len(s) for s in partition_iid(20000, 20, np.random.default_rng(1))])
    assert sizes.std() / sizes.mean() > 0.5 > 10 * iid_sizes.std() / iid_sizes.mean()
    assert sizes.min() >= 10 and sizes.sum() == 20000
    for s in shards:  # a large device's label mix is the overall one
        if len(s) >= 1000:
            assert _tv(np.bincount(labels[s], minlength=10), overall) < 0.1


# ---- #C = k label skew (Li et al. 2022) ---------------------------------------------------------
def test_label_skew_exactly_k_classes_split_evenly():
    labels = _labels(n=6000)
    shards = partition("label-skew", labels, 30, np.random.default_rng(0), classes_per_device=3)
    assert all(len(np.unique(labels[s])) == 3 for s in shards)
    for c in range(10):  # a class's samples are shared evenly among the devices holding it
        share = [int(np.sum(labels[s] == c)) for s in shards if np.any(labels[s] == c)]
        assert sum(share) == np.sum(labels == c)
        assert max(share) - min(share) <= 1


def test_label_skew_fewer_devices_than_classes_assigns_a_subset():
    labels = np.repeat(np.arange(10), 50)
    shards = partition("label-skew", labels, 3, np.random.default_rng(0), classes_per_device=2)
    held = set(np.unique(labels[np.concatenate(shards)]).tolist())
    assert all(len(np.unique(labels[s])) == 2 for s in shards)
    assert {0, 1, 2} <= held and len(held) <= 6
    assert sum(len(s) for s in shards) == 50 * len(held)


def test_label_skew_errors():
    labels = np.repeat(np.arange(4), 3)
    with pytest.raises(UserError, match=r"partition.classes_per_device=5 exceeds the 4 classes "
                                        r"in the training set; use at most 4"):
        partition("label-skew", labels, 2, np.random.default_rng(0), classes_per_device=5)


def test_label_skew_draws_with_replacement_when_a_class_has_too_few_samples():
    """12 devices x 2 classes of 4 classes of 3 samples: some class has more holders than
    samples, so every device draws m = k = 2 samples (one of each of its classes); with
    samples_per_device = 5, 3 of its first class (j mod 4) and 2 of its second."""
    labels = np.repeat(np.arange(4), 3)
    drawn = partition("label-skew", labels, 12, np.random.default_rng(0), classes_per_device=2)
    assert drawn.with_replacement and drawn.sizes.tolist() == [2] * 12
    for j, s in enumerate(drawn):
        assert len(set(labels[s].tolist())) == 2 and labels[s][0] == j % 4
    five = partition("label-skew", labels, 40, np.random.default_rng(1), classes_per_device=2,
                     samples_per_device=5)
    for j, s in enumerate(five):
        counts = np.bincount(labels[s], minlength=4)
        assert counts[j % 4] == 3 and sorted(counts.tolist()) == [0, 0, 2, 3]


# ---- per-device Dirichlet label mixes (seed 003) ------------------------------------------------
def test_client_dirichlet_sizes_and_rare_classes():
    """Nearly uniform mixes (alpha large), fixed sizes (sigma 0), ample samples: every device
    gets exactly size_median samples and the rare classes a rare_weight share of the others'."""
    labels = np.repeat(np.arange(10), 20000)
    shards = partition("client-dirichlet", labels, 50, np.random.default_rng(0), alpha=1e4,
                       rare_classes=[5, 6, 7, 8, 9], rare_weight=0.2, size_median=2000.0,
                       size_sigma=0.0)
    assert [len(s) for s in shards] == [2000] * 50
    totals = np.bincount(labels[np.concatenate(shards)], minlength=10)
    assert totals[5:].mean() / totals[:5].mean() == pytest.approx(0.2, rel=0.03)


def test_client_dirichlet_scales_down_a_class_that_runs_out():
    labels = np.repeat(np.arange(2), [10000, 30])
    shards = partition("client-dirichlet", labels, 8, np.random.default_rng(1), alpha=1e4,
                       size_median=100.0, size_sigma=0.0)
    held = np.bincount(labels[np.concatenate(shards)], minlength=2)
    assert held[1] == 30  # 8 devices asked for about 400 samples of class 1: all 30 are used
    assert held[0] == pytest.approx(400, abs=40)
    with pytest.raises(UserError, match=r"partition.rare_classes lists \[7\], which the "
                                        r"training set does not hold; its labels are \[0, 1\]"):
        partition("client-dirichlet", labels, 2, np.random.default_rng(0), rare_classes=[7])


# ---- errors -------------------------------------------------------------------------------------
def test_user_errors_name_the_key_and_the_fix():
    labels = np.arange(20) % 4
    rng = np.random.default_rng(0)
    with pytest.raises(UserError, match=r"partition.min_samples / population.num_devices: 5 "
                                        r"devices x 5 samples each exceeds the 0 training"):
        partition("dirichlet", labels[:0], 5, rng, alpha=1.0, min_samples=5)
    with pytest.raises(UserError, match=r"partition.samples_per_device=3 is below the 5 "
                                        r"samples scheme 'dirichlet' gives a device at least "
                                        r"\(partition.min_samples\); raise it to 5"):
        partition("dirichlet", labels, 50, rng, min_samples=5, samples_per_device=3)
    with pytest.raises(UserError, match=r"samples_per_device=1 is below the 2 samples scheme "
                                        r"'label-skew'.*classes_per_device \(one sample per "
                                        r"class\)"):
        partition("label-skew", labels, 5, rng, samples_per_device=1)
    with pytest.raises(UserError, match=r"partition.samples_per_device must be a positive "
                                        r"integer, got 2.5"):
        partition("iid", labels, 5, rng, samples_per_device=2.5)
    with pytest.raises(UserError, match=r"partition.alpha must be a positive finite number, "
                                        r"got 0"):
        partition("dirichlet", labels, 2, rng, alpha=0)
    with pytest.raises(UserError, match=r"partition.shards_per_device must be a positive "
                                        r"integer, got 1.5"):
        partition("shards", labels, 2, rng, shards_per_device=1.5)
    with pytest.raises(UserError, match=r"partition.alpha is not read by scheme 'iid' \(it reads "
                                        r"samples_per_device\); remove it"):
        partition("iid", labels, 2, rng, alpha=0.1)
    with pytest.raises(UserError, match=r"partition.samples_per_device is not read by scheme "
                                        r"'client-dirichlet'"):
        partition("client-dirichlet", labels, 2, rng, samples_per_device=3)


# ---- label counts and heterogeneity -------------------------------------------------------------
@pytest.mark.parametrize("scheme, params", SCHEMES)
def test_label_counts_match_bincount_per_shard(scheme, params):
    labels = _labels()
    shards = partition(scheme, labels, 15, np.random.default_rng(9), **params)
    counts = label_counts(labels, shards, 12)  # two classes with no samples: zero columns
    assert counts.shape == (15, 12)
    for row, s in zip(counts, shards):
        assert row.tolist() == np.bincount(labels[s], minlength=12).tolist()


def test_mean_tv_distance_by_hand():
    # Overall mix (0.5, 0.5); device 0 is (1, 0): TV 0.5; device 1 is (0, 1): TV 0.5.
    assert mean_tv_distance(np.array([[2, 0], [0, 2]])) == pytest.approx(0.5)
    assert mean_tv_distance(np.array([[3, 1], [3, 1]])) == 0.0
    # Overall (6/10, 4/10); device 0 (1, 0): 0.4, device 1 (2/8, 6/8): 0.35.
    assert mean_tv_distance(np.array([[2, 0], [2, 6]])) == pytest.approx((0.4 + 0.35) / 2)
    labels = np.repeat(np.arange(10), 400)
    tv = {a: mean_tv_distance(label_counts(labels, partition(
        "dirichlet", labels, 20, np.random.default_rng(0), alpha=a), 10)) for a in (0.05, 1000.0)}
    assert tv[1000.0] < 0.05
    assert tv[0.05] > 0.5


# ---- index sets (DeviceSamples) -------------------------------------------------------------------
def test_device_samples_index_sets():
    sets = part.DeviceSamples.from_arrays([[4, 2], [], [7], [1, 1, 0]])
    assert sets.sizes.tolist() == [2, 0, 1, 3] and sets.offsets.tolist() == [0, 2, 2, 3]
    assert len(sets) == 4 and sets.order.dtype == np.int64 and not sets.with_replacement
    assert [s.tolist() for s in sets] == [[4, 2], [], [7], [1, 1, 0]]
    assert sets[3].tolist() == [1, 1, 0] and sets[-1].tolist() == [1, 1, 0]
    assert sets.owner().tolist() == [0, 0, 2, 3, 3, 3]
    assert np.concatenate(sets).tolist() == [4, 2, 7, 1, 1, 0]
    mapped = sets.mapped(np.arange(10) * 10)
    assert mapped.order.tolist() == [40, 20, 70, 10, 10, 0] and mapped.sizes is sets.sizes
    assert part.DeviceSamples.coerce(sets) is sets
    with pytest.raises(IndexError):
        sets[4]
    with pytest.raises(ValueError, match="must add up to the 2 indices"):
        part.DeviceSamples(np.array([1, 2]), np.array([1, 2]))


# Digests (sha256 of sizes and order, int64) of splits that fit, recorded with the code before
# index sets (commit a9411f9, which returned a list of arrays), labels _labels(), seed 11.
RECORDED_SPLITS = [
    ("iid", {}, 25, "1fa3e6c8cc8ca84e"), ("iid", {}, 3000, "3c4b55f31028f2df"),
    ("dirichlet", {"alpha": 0.3}, 25, "3759077b3e42f65a"),
    ("dirichlet", {"alpha": 0.05, "min_samples": 5}, 300, "8fa73cfbf53c8a37"),
    # every one of the 100 draws leaves devices short: moved by _top_up (567 of 700 devices)
    ("dirichlet", {"alpha": 0.01, "min_samples": 4}, 700, "d5554bc4c5806f51"),
    ("shards", {"shards_per_device": 2}, 25, "489e4b438252a110"),
    ("shards", {"shards_per_device": 3}, 1000, "b0d39960d5ddb7cf"),
    ("quantity-skew", {"beta": 0.5, "min_samples": 3}, 25, "04fb813fa7f1a36b"),
    ("quantity-skew", {"beta": 0.1, "min_samples": 2}, 1500, "06e29146581cf4b2"),
    ("label-skew", {"classes_per_device": 3}, 25, "dae9bf270dffab99"),
    ("label-skew", {"classes_per_device": 2}, 4, "f6c0f03af448d808"),
    ("label-skew", {"classes_per_device": 2}, 290, "acb3991216f64bfd"),
    ("client-dirichlet", {"alpha": 0.3, "min_samples": 10, "rare_classes": [5, 6],
                          "size_median": 40.0}, 25, "f50119efaeb99f83"),
    # 100 devices ask 4,000+ of 3,000 samples: classes scaled down, every device keeps some
    ("client-dirichlet", {"alpha": 0.3, "min_samples": 40}, 100, "31ed04c3bdf0a1d7"),
]


@pytest.mark.parametrize("scheme, params, n, digest", RECORDED_SPLITS)
def test_splits_that_fit_are_the_recorded_ones(scheme, params, n, digest):
    import hashlib

    sets = partition(scheme, _labels(), n, np.random.default_rng(11), **params)
    assert not sets.with_replacement
    got = hashlib.sha256(sets.sizes.astype(np.int64).tobytes()
                         + sets.order.astype(np.int64).tobytes()).hexdigest()[:16]
    assert got == digest


def _top_up_by_scan(counts, need):
    """The moves as first written, in plain lists: for each short device in turn, the largest
    device (the first of equal ones) gives from its most frequent class (the first of equal
    ones) until the short one holds ``need``; a scan of all devices at every move."""
    table = counts.T.tolist()  # per device, per class
    for device in range(len(table)):
        while sum(table[device]) < need:
            sizes = [sum(row) for row in table]
            donor = sizes.index(max(sizes))
            row = table[donor]
            cls = row.index(max(row))
            moved = min(need - sizes[device], sizes[donor] - need, row[cls])
            row[cls] -= moved
            table[device][cls] += moved
    return np.array(table, dtype=np.int64).T


@pytest.mark.parametrize("seed", range(30))
def test_top_up_moves_as_the_scan(seed):
    """Small counts, many equal sizes (ties broken to the first device, as np.argmax)."""
    rng = np.random.default_rng(seed)
    classes, devices = int(rng.integers(1, 5)), int(rng.integers(2, 60))
    counts = rng.poisson(rng.uniform(0.2, 3.0), size=(classes, devices)).astype(np.int64)
    need = max(1, min(int(rng.integers(1, 5)), int(counts.sum()) // devices))
    if counts.sum() < need * devices:
        counts[0, 0] += need * devices
    expected = _top_up_by_scan(counts.copy(), need)
    assert np.array_equal(part._top_up(counts.copy(), need), expected)
    assert expected.sum(axis=0).min() >= need


# ---- with replacement: populations that outgrow the training set ----------------------------------
def test_iid_with_replacement_draws_m_uniform_samples():
    """20,000 devices x 3 samples of 3,000: every device 3, the draws those of
    rng.integers(0, 3000); indices uniform and labels at the set's frequencies (chi-square)."""
    from scipy.stats import chisquare

    labels = _labels()
    drawn = partition("iid", labels, 20_000, np.random.default_rng(5), samples_per_device=3)
    assert drawn.with_replacement and drawn.sizes.tolist() == [3] * 20_000
    assert np.array_equal(drawn.order, np.random.default_rng(5).integers(0, 3000, 60_000))
    assert chisquare(np.bincount(drawn.order, minlength=3000)).pvalue > 1e-3
    freq = np.bincount(labels, minlength=10) / len(labels)
    assert chisquare(np.bincount(labels[drawn.order], minlength=10), 60_000 * freq).pvalue > 1e-3
    # without samples_per_device: the split while it fits, one sample each beyond
    assert not partition("iid", labels, 3000, np.random.default_rng(5)).with_replacement
    beyond = partition("iid", labels, 3001, np.random.default_rng(5))
    assert beyond.with_replacement and beyond.sizes.tolist() == [1] * 3001


def test_dirichlet_with_replacement_replayed_and_its_label_statistics():
    """Device j's m = 20 samples are i.i.d. of class c with probability n_c D_jc / sum, D_j ~
    Dir(alpha 1_C): replayed with numpy (a comparison of each uniform with the cumulative mix);
    alpha = 10^4 gives every device the set's label frequencies (chi-square of all draws),
    alpha = 0.05 one dominant class a device; N min_samples > n defaults m to min_samples."""
    from scipy.stats import chisquare

    labels = _labels()
    n_dev, m = 4000, 20
    drawn = partition("dirichlet", labels, n_dev, np.random.default_rng(8), alpha=0.3,
                      samples_per_device=m)
    rng = np.random.default_rng(8)
    order = _sorted_by_label(labels, rng)
    sizes = np.bincount(labels)
    weights = rng.dirichlet(np.full(10, 0.3), n_dev) * sizes
    cum = np.cumsum(weights, axis=1) / weights.sum(axis=1, keepdims=True)
    owner = np.repeat(np.arange(n_dev), m)
    cls = (rng.random(n_dev * m)[:, None] >= cum[owner, :-1]).sum(axis=1)
    expected = order[np.cumsum(sizes)[cls] - sizes[cls] + rng.integers(0, sizes[cls])]
    assert drawn.with_replacement and np.array_equal(drawn.order, expected)
    flat = partition("dirichlet", labels, n_dev, np.random.default_rng(9), alpha=1e4,
                     samples_per_device=m)
    freq = np.bincount(labels, minlength=10) / len(labels)
    assert chisquare(np.bincount(labels[flat.order], minlength=10), n_dev * m * freq).pvalue > 1e-3
    skewed = partition("dirichlet", labels, n_dev, np.random.default_rng(9), alpha=0.05,
                       samples_per_device=m)
    top = label_counts(labels, skewed, 10).max(axis=1) / m
    assert np.median(top) > 0.7
    default = partition("dirichlet", labels, 1000, np.random.default_rng(1), min_samples=4)
    assert default.with_replacement and default.sizes.tolist() == [4] * 1000


def test_quantity_skew_with_replacement_sizes_and_samples():
    labels = _labels()
    drawn = partition("quantity-skew", labels, 5000, np.random.default_rng(2), beta=0.5,
                      min_samples=2, samples_per_device=6)
    rng = np.random.default_rng(2)
    q = rng.dirichlet(np.full(5000, 0.5))
    cuts = np.floor(np.cumsum(q) * 5000 * 4).astype(np.int64)
    cuts[-1] = 5000 * 4
    sizes = 2 + np.diff(cuts, prepend=0)
    assert np.array_equal(drawn.sizes, sizes) and drawn.sizes.sum() == 5000 * 6
    assert np.array_equal(drawn.order, rng.integers(0, 3000, 30_000))
    assert drawn.sizes.min() >= 2 and drawn.sizes.std() > 0.5 * drawn.sizes.mean()  # skewed


def test_client_dirichlet_draws_in_full_when_devices_would_be_left_without_samples():
    """200 devices x 5 samples asked of 20 (5 classes of 4): scaled down, most would hold
    none; instead every device draws its 5, rare classes at a fifth of the others' rate."""
    from scipy.stats import chisquare

    labels = np.repeat(np.arange(5), 4)
    drawn = partition("client-dirichlet", labels, 200, np.random.default_rng(0), alpha=1e4,
                      min_samples=1, rare_classes=[3, 4], rare_weight=0.2, size_median=5.0,
                      size_sigma=0.0)
    assert drawn.with_replacement and drawn.sizes.tolist() == [5] * 200
    expected = np.array([1, 1, 1, 0.2, 0.2]) / 3.4 * 1000
    assert chisquare(np.bincount(labels[drawn.order], minlength=5), expected).pvalue > 1e-3
