"""Keyed random streams: a device's noise depends on (seed, stream, round, device) only."""

import itertools

import numpy as np
import pytest
import torch

from wirelessfl.learning.seeds import DEVICE_BLOCK, device_uniform, keyed_rng, stream_key


@pytest.mark.parametrize("cuts", [[0, 1, 64, 65, 130], [0, 63, 64, 128, 130], [0, 7, 100, 130]])
def test_device_uniform_does_not_depend_on_how_devices_are_grouped(cuts):
    whole = device_uniform(3, "up", 5, slice(0, 130), 17)
    pieces = torch.cat([device_uniform(3, "up", 5, slice(a, b), 17)
                        for a, b in itertools.pairwise(cuts)])
    assert torch.equal(whole, pieces)
    single = torch.stack([device_uniform(3, "up", 5, slice(i, i + 1), 17)[0] for i in range(130)])
    assert torch.equal(whole, single)


def test_device_uniform_values_and_keys():
    u = device_uniform(0, "up", 1, slice(0, 2 * DEVICE_BLOCK), 500)
    assert u.shape == (128, 500) and u.dtype == torch.float32
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.01  # 64,000 uniforms: sd of the mean ~ 0.0011
    assert not torch.equal(u, device_uniform(0, "up", 2, slice(0, 128), 500))  # round matters
    assert not torch.equal(u, device_uniform(0, "down", 1, slice(0, 128), 500))  # stream matters
    assert not torch.equal(u[:64], u[64:])  # blocks are distinct streams


def test_stream_key_is_stable_and_separates_streams():
    assert stream_key(0, "a", 1) == stream_key(0, "a", 1)
    assert len({stream_key(0, "a", 1), stream_key(1, "a", 1), stream_key(0, "b", 1),
                stream_key(0, "a", 2)}) == 4
    assert 0 <= stream_key(2**40, "x") < 2**63
    assert np.array_equal(keyed_rng(1, "s").random(4), keyed_rng(1, "s").random(4))
