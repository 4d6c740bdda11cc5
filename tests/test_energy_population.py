"""Heterogeneous populations: per-device prices equal their class's scalar prices, class counts
follow the fractions exactly, clock draws follow their distributions."""

from __future__ import annotations

import numpy as np
import pytest

from wirelessfl.energy import (
    CmosProfile,
    ComputeModel,
    EnergyProfile,
    ModelProfile,
    PopulationCompute,
    class_counts,
    draw_device_classes,
    lognormal_frequencies_hz,
    uniform_frequencies_hz,
)
from wirelessfl.errors import UserError
from wirelessfl.scenario import catalog

CNN = ModelProfile(params=45_362, macs_per_sample=10_514_640, activations_per_sample=25_042,
                   input_size=784)


def _profile(name: str) -> EnergyProfile:
    return EnergyProfile.model_validate(catalog.load_mapping("energy", name, "test"))


def test_per_device_arrays_equal_the_class_scalars():
    models = [ComputeModel(_profile(n), CNN, 16)
              for n in ("seed002-accelerator", "smartphone-soc", "mcu-iot")]
    classes = np.array([2, 0, 1, 1, 2, 0, 0])
    pop = PopulationCompute(models, classes)
    for batch in (1, 10):
        for method in ("forward_energy_j", "backward_energy_j", "forward_time_s",
                       "backward_time_s"):
            got = getattr(pop, method)(batch)
            assert got.shape == (7,)
            for i, c in enumerate(classes):
                assert got[i] == getattr(models[c], method)(batch)


def test_engine_arithmetic_works_unchanged():
    # network.py: fwd [N] * compute.forward_energy_j(b), with pass counts per device.
    models = [ComputeModel(EnergyProfile(), CNN, 16), ComputeModel(CmosProfile(), CNN, 16)]
    pop = PopulationCompute(models, np.array([0, 1, 1]))
    fwd, bwd = np.array([2.0, 2.0, 0.0]), np.array([0.0, 1.0, 1.0])
    energy = fwd * pop.forward_energy_j(10) + bwd * pop.backward_energy_j(10)
    want = [2 * models[0].forward_energy_j(10),
            2 * models[1].forward_energy_j(10) + models[1].backward_energy_j(10),
            models[1].backward_energy_j(10)]
    np.testing.assert_allclose(energy, want, rtol=1e-15)
    np.testing.assert_allclose(pop.energy_j(fwd, bwd, 10), want, rtol=1e-15)
    time = pop.time_s(fwd, bwd, 10)
    assert time[2] == models[1].backward_time_s(10)
    with pytest.raises(ValueError):
        pop.forward_energy_j(10)[0] = 0.0  # shared cached arrays are read-only


def test_per_device_frequencies_by_hand():
    profile = CmosProfile(kappa=2e-28, cpu_frequency_hz=2e9, cycles_per_mac=1.5)
    f = np.array([1e9, 2e9, 3e9])
    pop = PopulationCompute.from_profiles([profile], CNN, 16, np.zeros(3, dtype=int), f)
    cycles = 1.5 * 10 * 10_514_640
    np.testing.assert_allclose(pop.forward_energy_j(10), 2e-28 * cycles * f ** 2, rtol=1e-14)
    np.testing.assert_allclose(pop.backward_energy_j(10), 2 * 2e-28 * cycles * f ** 2,
                               rtol=1e-14)
    np.testing.assert_allclose(pop.forward_time_s(10), cycles / f, rtol=1e-14)
    np.testing.assert_allclose(pop.backward_time_s(10), 2 * cycles / f, rtol=1e-14)
    # At the profile's own clock a device costs what the scalar model says.
    scalar = ComputeModel(profile, CNN, 16)
    assert pop.forward_energy_j(10)[1] == pytest.approx(scalar.forward_energy_j(10), rel=1e-14)
    assert pop.forward_time_s(10)[1] == pytest.approx(scalar.forward_time_s(10), rel=1e-14)


def test_frequencies_need_cmos_and_classes_need_models():
    seed = ComputeModel(EnergyProfile(), CNN, 16)
    with pytest.raises(UserError, match="'cmos'"):
        PopulationCompute([seed], np.zeros(2, dtype=int), np.array([1e9, 2e9]))
    with pytest.raises(UserError, match="outside"):
        PopulationCompute([seed], np.array([0, 1]))
    with pytest.raises(UserError, match="integer"):
        PopulationCompute([seed], np.array([0.0, 1.0]))


@pytest.mark.parametrize(("fractions", "n", "counts"), [
    ((0.3, 0.7), 10, [3, 7]),
    ((0.3, 0.7), 7, [2, 5]),  # quotas 2.1, 4.9: the remainder goes to 0.9
    ((1 / 3, 1 / 3, 1 / 3), 10, [4, 3, 3]),  # a tie goes to the earlier class
    ((0.5, 0.25, 0.25), 1, [1, 0, 0]),
    ((1.0,), 0, [0]),
])
def test_class_counts_by_largest_remainder(fractions, n, counts):
    assert class_counts(fractions, n).tolist() == counts


def test_class_counts_always_sum_to_n_and_stay_within_one_of_the_quota():
    rng = np.random.default_rng(0)
    for _ in range(200):
        f = rng.dirichlet(np.ones(rng.integers(1, 6)))
        f = f / f.sum()
        n = int(rng.integers(0, 500))
        counts = class_counts(f, n)
        assert counts.sum() == n
        assert np.all(np.abs(counts - f * n) < 1)


@pytest.mark.parametrize("bad", [(0.3, 0.6), (1.2, -0.2), ()])
def test_class_counts_reject_bad_fractions(bad):
    with pytest.raises(UserError, match="fractions"):
        class_counts(bad, 10)


def test_draw_device_classes_exact_counts_then_shuffled():
    fractions = {"smartphone-soc": 0.3, "mcu-iot": 0.7}
    names, classes = draw_device_classes(fractions, 50, np.random.default_rng(1))
    assert names == ["smartphone-soc", "mcu-iot"]
    assert np.bincount(classes, minlength=2).tolist() == [15, 35]
    again = draw_device_classes(fractions, 50, np.random.default_rng(1))[1]
    np.testing.assert_array_equal(classes, again)
    other = draw_device_classes(fractions, 50, np.random.default_rng(2))[1]
    assert not np.array_equal(classes, other)
    assert not np.array_equal(classes, np.sort(classes))  # shuffled, not in blocks
    with pytest.raises(UserError, match="mcu-iot: 0.6"):
        draw_device_classes({"smartphone-soc": 0.3, "mcu-iot": 0.6}, 50, np.random.default_rng(1))


def test_uniform_frequencies():
    f = uniform_frequencies_hz(10_000, 1e9, 3e9, np.random.default_rng(3))
    assert f.shape == (10_000,) and f.min() >= 1e9 and f.max() <= 3e9
    assert f.mean() == pytest.approx(2e9, rel=0.02)
    with pytest.raises(UserError):
        uniform_frequencies_hz(5, 3e9, 1e9, np.random.default_rng(3))


def test_lognormal_frequencies():
    f = lognormal_frequencies_hz(20_000, 2e9, 0.3, np.random.default_rng(4))
    assert np.median(f) == pytest.approx(2e9, rel=0.02)
    assert np.std(np.log(f)) == pytest.approx(0.3, rel=0.03)
    clipped = lognormal_frequencies_hz(1_000, 2e9, 1.0, np.random.default_rng(4), 1e9, 3e9)
    assert clipped.min() == 1e9 and clipped.max() == 3e9
