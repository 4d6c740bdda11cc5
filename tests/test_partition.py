"""Partitioners: i.i.d. (unchanged), Dirichlet, shards, quantity skew, #C = k label skew,
per-device Dirichlet label mixes.

Truths are computed here with np.bincount / np.unique on each device's labels, not with the
module's own label_counts (which is itself checked against np.bincount below).
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


def test_shards_too_many():
    with pytest.raises(UserError, match=r"partition.shards_per_device: 6 devices x 2 shards = 12 "
                                        r"shards exceeds the 10 training samples.*fewer shards"):
        partition("shards", np.arange(10) % 2, 6, np.random.default_rng(0), shards_per_device=2)


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
    with pytest.raises(UserError, match=r"partition.classes_per_device=2: class \d has 3 samples "
                                        r"for \d devices.*population.num_devices"):
        partition("label-skew", labels, 12, np.random.default_rng(0), classes_per_device=2)


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
                                        r"devices x 5 samples each exceeds the 20 training"):
        partition("dirichlet", labels, 5, rng, alpha=1.0, min_samples=5)
    with pytest.raises(UserError, match=r"partition.min_samples / population.num_devices: 30 "
                                        r"devices x 1 samples.*use fewer devices"):
        partition("quantity-skew", labels, 30, rng)
    with pytest.raises(UserError, match=r"partition.alpha must be a positive finite number, "
                                        r"got 0"):
        partition("dirichlet", labels, 2, rng, alpha=0)
    with pytest.raises(UserError, match=r"partition.shards_per_device must be a positive "
                                        r"integer, got 1.5"):
        partition("shards", labels, 2, rng, shards_per_device=1.5)
    with pytest.raises(UserError, match=r"partition.alpha is not read by scheme 'iid' \(it reads "
                                        r"no parameters\); remove it"):
        partition("iid", labels, 2, rng, alpha=0.1)


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
