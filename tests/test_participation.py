"""Participants as indices: the devices of Algorithm.participants's mask, a uniform sample, drawn
in memory that follows the sample, not the population."""

from __future__ import annotations

import tracemalloc
from types import SimpleNamespace

import numpy as np
from scipy import stats

from wirelessfl.algorithms.base import Algorithm
from wirelessfl.algorithms.participation import participant_indices
from wirelessfl.learning.seeds import keyed_rng


def test_the_indices_are_the_devices_of_the_algorithms_mask():
    """The asked devices as every recorded result drew them: round(beta N) of N from
    keyed_rng(seed, "participation", k, stage...).choice(N, count, replace=False), as indices
    (participant_indices), as the algorithm's indices and as its [N] mask."""
    for n, beta, seed in ((50, 0.3, 0), (20_000, 0.005, 3), (1_000, 0.1, 7)):
        stub = SimpleNamespace(ctx=SimpleNamespace(num_devices=n, seed=seed),
                               params=SimpleNamespace(participation=beta))
        stub.participant_devices = lambda k, *stage, s=stub: Algorithm.participant_devices(
            s, k, *stage)
        count = max(1, round(beta * n))
        for keys in ((0,), (1,), (4,), (2, 1)):  # (2, 1): an extra stage key (FedNest)
            drawn = keyed_rng(seed, "participation", *keys).choice(n, count, replace=False)
            reference = np.zeros(n, dtype=bool)
            reference[drawn] = True
            ids = participant_indices(seed, n, count, *keys)
            np.testing.assert_array_equal(ids, np.flatnonzero(reference))
            np.testing.assert_array_equal(Algorithm.participant_devices(stub, *keys), ids)
            np.testing.assert_array_equal(Algorithm.participants(stub, *keys), reference)
    everyone = SimpleNamespace(ctx=SimpleNamespace(num_devices=7, seed=0),
                               params=SimpleNamespace(participation=1.0))
    np.testing.assert_array_equal(Algorithm.participant_devices(everyone, 3), np.arange(7))
    assert Algorithm.participants(everyone, 3).all()


def test_a_sample_is_distinct_sorted_and_uniform_over_the_devices():
    """2,000 rounds of 100 of 20,000 devices: every sample holds distinct sorted indices; the
    counts over 100 equal blocks of devices pass a chi-square test of uniformity, and so do
    the positions of the devices within their block (no bias to low or high indices)."""
    n, count, rounds = 20_000, 100, 2_000
    draws = np.concatenate([participant_indices(1, n, count, k) for k in range(rounds)])
    samples = draws.reshape(rounds, count)
    assert (np.diff(samples, axis=1) > 0).all()
    assert stats.chisquare(np.bincount(draws // 200, minlength=100)).pvalue > 1e-3
    assert stats.chisquare(np.bincount(draws % 200 // 2, minlength=100)).pvalue > 1e-3


def test_a_sample_of_a_billion_devices_allocates_what_the_sample_needs():
    """Floyd's algorithm: 1,000 of 10^9 devices in tens of kB (an [N] mask would be 1 GB)."""
    tracemalloc.start()
    ids = participant_indices(0, 10**9, 1_000, 5)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(np.unique(ids)) == 1_000 and ids.max() < 10**9
    assert peak < 100_000
