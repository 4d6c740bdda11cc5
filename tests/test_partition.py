"""The i.i.d. split: disjoint, complete, balanced, reproducible."""

import numpy as np
import pytest

from wirelessfl.errors import UserError
from wirelessfl.learning.partition import PARTITIONERS, partition, partition_iid


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
    assert "iid" in PARTITIONERS
    with pytest.raises(UserError, match="partition.scheme 'dirichlet' is unknown; choose one of iid"):
        partition("dirichlet", labels, 4, np.random.default_rng(5))
