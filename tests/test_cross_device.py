"""Cross-device rounds: per-device random streams, computing only the devices whose work
matters, and per-device state held only for the devices that have some.

Truths: a pure-Python SplitMix64 (the counter generator's definition), the rows of a whole
population's draw (any subset must get them), plain per-device autograd references written
from the papers' update rules (SCAFFOLD, FedAvg), and the closed form of the expected number of
devices that ever took part."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import (
    record_collects,
    record_delivered,
    run_recording_thetas,
    small_scenario,
)
from tests.test_heterogeneity_baselines import EXACT, scaffold_reference_round
from wirelessfl.algorithms import device_state
from wirelessfl.algorithms.device_state import BLOCK_ROWS, DeviceRows, expected_rows
from wirelessfl.learning.minibatch import sample_device_minibatches
from wirelessfl.learning.seeds import counter_uniform, device_uniform, stream_key
from wirelessfl.scenario.schema import SHARED_STREAMS_MAX_DEVICES, PopulationConfig

MASK = 2**64 - 1


def _splitmix_reference(seed, stream, keys, device, count):
    """SplitMix64 in Python integers: key = mix(device * golden + base), value j =
    mix(key ^ (j + 1) * golden) >> 11 / 2^53."""
    golden = 0x9E3779B97F4A7C15

    def mix(z):
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    key = mix((device * golden + stream_key(seed, stream, *keys)) & MASK)
    return [(mix(key ^ (((j + 1) * golden) & MASK)) >> 11) / 2**53 for j in range(count)]


def test_counter_uniform_is_splitmix64_per_device():
    devices = np.array([0, 1, 7, 999_999, 123_456_789])
    got = counter_uniform(4, "batch", (2, 5), devices, 6)
    for row, device in zip(got, devices):
        assert row.tolist() == _splitmix_reference(4, "batch", (2, 5), int(device), 6)
    many = counter_uniform(0, "x", (1,), np.arange(2000), 50)
    assert abs(many.mean() - 0.5) < 0.005 and abs(many.var() - 1 / 12) < 0.002


def test_any_subset_of_devices_gets_the_population_rows():
    rng = np.random.default_rng(1)
    full = counter_uniform(1, "s", (3,), np.arange(500), 9)
    sizes = torch.as_tensor(rng.integers(3, 40, 500))
    offsets = torch.cumsum(sizes, 0) - sizes
    batches = sample_device_minibatches(1, "b", (3,), np.arange(500), sizes, offsets, 10, 4)
    for cols in (1, 7, 64):
        noise = device_uniform(2, "q", 5, slice(0, 500), cols)
        for _ in range(50):
            subset = np.unique(rng.integers(0, 500, rng.integers(1, 30)))
            assert torch.equal(device_uniform(2, "q", 5, subset, cols), noise[subset])
    for _ in range(50):
        subset = np.unique(rng.integers(0, 500, rng.integers(1, 30)))
        assert np.array_equal(counter_uniform(1, "s", (3,), subset, 9), full[subset])
        got = sample_device_minibatches(1, "b", (3,), subset, sizes, offsets, 10, 4)
        assert torch.equal(got, batches[:, torch.as_tensor(subset)])


def test_per_device_minibatches_are_uniform_subsets_without_replacement():
    sizes = torch.tensor([25, 4, 10])
    offsets = torch.cumsum(sizes, 0) - sizes
    counts = np.zeros(25)
    for k in range(2000):
        idx = sample_device_minibatches(0, "b", (k,), np.array([0, 1, 2]), sizes, offsets, 10)
        first = idx[0, 0].numpy()
        assert len(set(first)) == 10 and first.min() >= 0 and first.max() < 25
        assert sorted(idx[0, 1, :4].tolist()) == [25, 26, 27, 28]  # short device: all, once
        assert sorted(idx[0, 2].tolist()) == list(range(29, 39))  # m = b: its whole data
        counts[first] += 1
    expected = 2000 * 10 / 25  # each sample in a b-subset with probability b / m
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 52.6  # chi-square, 24 degrees of freedom, p = 0.001


def test_default_streams_follow_the_population_size():
    assert not PopulationConfig(num_devices=SHARED_STREAMS_MAX_DEVICES).per_device_streams
    assert PopulationConfig(num_devices=SHARED_STREAMS_MAX_DEVICES + 1).per_device_streams
    assert PopulationConfig(num_devices=8, random_streams="per-device").per_device_streams
    assert "random_streams" not in PopulationConfig(num_devices=8).model_dump()


def test_device_rows_hold_only_written_devices():
    rng = np.random.default_rng(2)
    n, d = 5000, 3
    store = DeviceRows(n, torch.zeros(d))
    dense = torch.zeros(n, d)
    for _ in range(30):
        devices = np.unique(rng.integers(0, n, 60))
        values = torch.randn(len(devices), d)
        store.set(devices, store.get(devices) + values)
        dense[devices] += values
    assert torch.equal(store.dense(), dense)
    touched = int((dense != 0).any(1).sum())
    assert store.held == touched
    assert len(store.blocks) == -(-touched // BLOCK_ROWS)


def test_rows_of_a_large_model_are_stored_in_blocks_that_fit(monkeypatch):
    """A row of a large model (ResNet-18: 11.2 million float32) would make a block of BLOCK_ROWS
    rows 46 GB: blocks then hold as many rows as fit in BLOCK_BYTES, and the rows read back as
    written. Here the cap is lowered so that a 1,000-value row takes the large-model path."""
    monkeypatch.setattr(device_state, "BLOCK_BYTES", 3 * 1000 * 4)
    store = DeviceRows(10, torch.zeros(1000))
    assert store.rows_per_block == 3
    values = torch.randn(7, 1000)
    store.set(np.arange(7), values)
    assert len(store.blocks) == 3 and all(b.shape == (3, 1000) for b in store.blocks)
    assert torch.equal(store.get(np.arange(7)), values)
    assert torch.equal(store.get(np.array([9])), torch.zeros(1, 1000))
    monkeypatch.undo()
    assert DeviceRows(10, torch.zeros(1000)).rows_per_block == BLOCK_ROWS  # the real cap: as before


def test_expected_rows_closed_form_against_simulation():
    n, beta, rounds = 1000, 0.01, 150
    rng = np.random.default_rng(3)
    seen = np.zeros(n, bool)
    ever = []
    for _ in range(20):
        seen[:] = False
        for _ in range(rounds):
            seen[rng.choice(n, 10, replace=False)] = True
        ever.append(seen.sum())
    assert abs(np.mean(ever) - expected_rows(n, beta, rounds)) < 0.02 * n


def _scenario(name, **params):
    return small_scenario([*EXACT, "population.random_streams=per-device"],
                          algorithms=[{"name": name, "rounds": 3, "eval_every": 1,
                                       "local_steps": 3, "lr": 0.3, "participation": 0.5,
                                       **params}])


def test_scaffold_per_device_streams_match_a_per_device_reference(monkeypatch):
    """SCAFFOLD option II with half the devices asked per round, per-device minibatches: the
    batched, participants-only run against plain autograd over the same devices, with dense
    control variates in the reference."""
    lr, steps = 0.3, 3
    delivered = record_delivered(monkeypatch)
    world, thetas, _ = run_recording_thetas(monkeypatch, _scenario("scaffold"))
    ev, n = world.evaluator, world.num_devices
    theta, c, c_i = thetas[0], torch.zeros_like(thetas[0]), torch.zeros(n, thetas[0].numel())
    for k in range(3):
        asked = np.flatnonzero(delivered[k])
        assert len(asked) == n // 2
        idx = sample_device_minibatches(3, "batch", (k,), np.arange(n), ev.data.sizes,
                                        ev.data.offsets, 10, steps)
        theta, c = scaffold_reference_round(world, theta, c, c_i, idx, asked, lr, steps)
        torch.testing.assert_close(thetas[k + 1], theta, rtol=1e-4, atol=1e-5)


def test_only_delivered_devices_are_computed(monkeypatch):
    """FedAvg's local SGD runs on the rows of the delivered devices only."""
    from wirelessfl.problems.base import Problem

    rows = []
    original = Problem.local_sgd

    def counting(self, theta, idx, lr, steps=None):
        rows.append(idx.shape[1])
        yield from original(self, theta, idx, lr, steps)

    monkeypatch.setattr(Problem, "local_sgd", counting)
    delivered = record_delivered(monkeypatch)
    run_recording_thetas(monkeypatch, _scenario("fedavg"))
    assert rows == [int(d.sum()) for d in delivered]
    assert max(rows) < 8


@pytest.mark.parametrize("name", ["fedavg", "scaffold", "dzofl", "fgdro-kl"])
def test_per_device_runs_are_reproducible_and_finite(monkeypatch, name):
    if name == "dzofl":
        sc = small_scenario([*EXACT, "population.random_streams=per-device"],
                            algorithms=[{"name": "dzofl", "rounds": 5, "eval_every": 1,
                                         "participation": 0.5}])
    else:
        sc = _scenario(name)
    _, first, _ = run_recording_thetas(monkeypatch, sc)
    _, again, _ = run_recording_thetas(monkeypatch, sc)
    for a, b in zip(first, again):
        assert torch.equal(a, b) and bool(torch.isfinite(a).all())
    assert not torch.equal(first[0], first[-1])


@pytest.mark.parametrize("name", ["fedavg", "scaffold", "dzofl"])
@pytest.mark.parametrize("setting", [
    # uploads and broadcasts lost (some delivered, some not), batteries running out mid-run
    ["channel.uplink.tx_power_dbm=-10", "channel.downlink.loss=true",
     "channel.downlink.tx_power_dbm=-5"],
    ["energy.battery_j=0.0015", "energy.idle_power_w=0.1"],
])
def test_asking_by_index_equals_asking_by_mask(monkeypatch, name, setting):
    """With per-device streams an index-reading algorithm asks the network by device index
    (the engine's cost follows the participants); asking the same devices by [N] mask must give
    the same models, the same ledger and the same rows (fading, lost uploads, downlink loss,
    batteries running out)."""
    from wirelessfl.plugins import ALGORITHMS

    sc = small_scenario(["population.random_streams=per-device", *setting],
                        algorithms=[{"name": name, "rounds": 4, "eval_every": 1,
                                     "participation": 0.5, **({} if name == "dzofl" else
                                                              {"local_steps": 2, "lr": 0.1})}])
    cls = ALGORITHMS.get(name)
    assert cls.reads_device_indices
    asked = record_collects(monkeypatch, lambda _, result: result.devices is not None)
    _, by_index, run_i = run_recording_thetas(monkeypatch, sc)
    assert asked and all(asked)
    monkeypatch.setattr(cls, "reads_device_indices", False)
    asked.clear()
    _, by_mask, run_m = run_recording_thetas(monkeypatch, sc)
    assert asked and not any(asked)
    assert len(by_index) == len(by_mask)
    for a, b in zip(by_index, by_mask):
        assert torch.equal(a, b)
    for field in ("energy_j", "bits_up", "bits_down", "packets_delivered", "broadcasts_missed",
                  "depleted_at_s"):
        np.testing.assert_array_equal(getattr(run_i.ledger, field), getattr(run_m.ledger, field))
    import pandas as pd

    rows_i, rows_m = pd.DataFrame(run_i.rows), pd.DataFrame(run_m.rows)
    host = [c for c in rows_i.columns if "host" in c or "wall" in c]
    pd.testing.assert_frame_equal(rows_i.drop(columns=host), rows_m.drop(columns=host))
