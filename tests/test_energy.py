"""The seed-002 energy model (eqs. 5-10) against arithmetic written out by hand."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from pydantic import ValidationError

from wirelessfl.energy import (
    ComputeModel,
    EnergyProfile,
    ModelProfile,
    Seed002AcceleratorProfile,
    backward_energy_j,
    forward_energy_j,
    mac_energy_j,
)
from wirelessfl.energy.accelerator import forward_energy_terms
from wirelessfl.energy.radio import radio_energy_j
from wirelessfl.errors import UserError

REL = 1e-12
CATALOG = Path(__file__).resolve().parents[1] / "energy" / "seed002-accelerator.yaml"

# Seed 002, Sec. V: N_c, O_c (25,042 x 10), d (backward); plus x_in = 784 (forward).
PAPER = {"macs": 10.56e6, "activations": 250_420, "params": 45_362}
A = 3.7e-12  # E_MAC(M_max) [J]
E16 = 3.7e-12 * 0.5 ** 1.25  # E_MAC(16) = A (16 / 32)^1.25 [J]
SQ16 = math.sqrt(16 / (64 * 32))  # sqrt(M / (p_u M_max)) = sqrt(1/128)


def _paper_forward_by_hand(spill_bits: float = 0.0) -> float:
    computing = E16 * 10.56e6 + 3 * 250_420 * A  # eq. 6
    weights = 2 * E16 * 45_362 + E16 * 10.56e6 * SQ16  # eq. 7
    acts = 2 * E16 * 250_420 + E16 * 10.56e6 * SQ16  # eq. 8
    dram = 150 * A * 784 + 2 * 150 * E16 * spill_bits  # eq. 9
    return computing + weights + acts + dram


def _paper_backward_by_hand(spill_bits: float = 0.0) -> float:
    # eq. 10 at M_max: 2 N_c A + 2 O_c A + d A + 2 N_c A sqrt(1/64) + 2 A_d A spill
    return (2 * 10.56e6 * A + 2 * 250_420 * A + 45_362 * A + 2 * 10.56e6 * A * (1 / 8)
            + 2 * 150 * A * spill_bits)


def test_forward_energy_paper_inputs():
    # d M + O_c M = (45,362 + 250,420) x 16 = 4,732,512 bits < S = 67,108,864: no spill.
    expected = _paper_forward_by_hand()
    got = forward_energy_j(EnergyProfile(), bits=16, input_size=784, **PAPER)
    assert got == pytest.approx(expected, rel=REL)
    assert got == pytest.approx(2.3467e-5, rel=1e-4)


def test_backward_energy_paper_inputs():
    # (d + O_c) x 32 = 9,465,024 bits < S: no spill. Sum = A x 24,306,202.
    expected = _paper_backward_by_hand()
    got = backward_energy_j(EnergyProfile(), **PAPER)
    assert got == pytest.approx(expected, rel=REL)
    assert got == pytest.approx(3.7e-12 * 24_306_202, rel=REL)


def test_forward_terms_sum_to_forward_energy():
    profile = EnergyProfile()
    terms = forward_energy_terms(profile, bits=16, input_size=784, **PAPER)
    assert set(terms) == {"computing", "weights", "activations", "dram"}
    assert terms["dram"] == pytest.approx(150 * A * 784, rel=REL)
    total = forward_energy_j(profile, bits=16, input_size=784, **PAPER)
    assert sum(terms.values()) == pytest.approx(total, rel=REL)


def test_dram_term_switches_on_past_sram():
    profile = EnergyProfile(sram_bits=1e6)
    fwd_spill = (45_362 + 250_420) * 16 - 1e6  # 3,732,512 bits
    bwd_spill = (45_362 + 250_420) * 32 - 1e6  # 8,465,024 bits
    assert forward_energy_j(profile, bits=16, input_size=784, **PAPER) == pytest.approx(
        _paper_forward_by_hand(fwd_spill), rel=REL)
    assert backward_energy_j(profile, **PAPER) == pytest.approx(
        _paper_backward_by_hand(bwd_spill), rel=REL)
    # At S = d M + O_c M exactly the spill is zero.
    edge = EnergyProfile(sram_bits=(45_362 + 250_420) * 16)
    assert forward_energy_j(edge, bits=16, input_size=784, **PAPER) == pytest.approx(
        _paper_forward_by_hand(), rel=REL)


def test_mac_energy_at_max_precision_is_a_and_increasing():
    profile = EnergyProfile()
    assert mac_energy_j(profile, 32) == 3.7e-12
    assert mac_energy_j(profile, 16) == pytest.approx(E16, rel=REL)
    values = [mac_energy_j(profile, m) for m in range(1, 33)]
    assert all(a < b for a, b in itertools.pairwise(values))


@pytest.mark.parametrize("bad", [
    {"mac_energy_j": -3.7e-12},
    {"mac_energy_j": 0},
    {"mac_exponent": 1.0},
    {"mac_exponent": 2.0},
    {"mac_exponent": 0.5},
    {"mac_exponent": 2.5},
    {"mac_units": 0},
    {"rx_power_w": -0.1},
    {"model": "cmso"},
    {"mac_energy": 3.7e-12},
    {"kappa": 1e-28},  # a field of the cmos model, not of this one
    {"sources": {"not_a_field": "x"}},
])
def test_profile_rejects_bad_values(bad):
    with pytest.raises(ValidationError):
        EnergyProfile(**bad)


def test_catalog_entry_matches_defaults():
    doc = yaml.safe_load(CATALOG.read_text())
    numbers = [k for k in Seed002AcceleratorProfile.model_fields
               if k not in ("name", "description", "model", "sources")]
    # YAML 1.1 reads '4.0e9' as a string; the file must hold real numbers (or null).
    assert all(doc[k] is None or isinstance(doc[k], (int, float)) for k in numbers)
    profile = EnergyProfile(**doc)
    assert type(profile) is Seed002AcceleratorProfile
    assert profile.name == "seed002-accelerator"
    assert set(profile.sources) == set(numbers)
    defaults = EnergyProfile()
    assert all(getattr(profile, k) == getattr(defaults, k) for k in numbers)


# ComputeModel: the seed-002 CNN's per-sample profile (see test_profiler.py).
CNN = ModelProfile(params=45_362, macs_per_sample=10_514_640, activations_per_sample=25_042,
                   input_size=784)


def test_compute_model_batch_of_ten_by_hand():
    compute = ComputeModel(EnergyProfile(), CNN, bits=16)
    n_c, o_c, x_in, d = 105_146_400, 250_420, 7_840, 45_362  # batch of 10; d once
    fwd = (E16 * n_c + 3 * o_c * A + 2 * E16 * d + E16 * n_c * SQ16 + 2 * E16 * o_c
           + E16 * n_c * SQ16 + 150 * A * x_in)
    bwd = 2 * n_c * A + 2 * o_c * A + d * A + 2 * n_c * A / 8
    assert compute.forward_energy_j(10) == pytest.approx(fwd, rel=REL)
    assert compute.backward_energy_j(10) == pytest.approx(bwd, rel=REL)
    assert compute.forward_time_s(10) == pytest.approx(105_146_400 / 4e9, rel=REL)
    assert compute.backward_time_s(10) == pytest.approx(2 * 105_146_400 / 4e9, rel=REL)


def test_compute_model_is_affine_in_batch():
    # No DRAM spill: E(b) = (d term) + b x (per-sample terms), so equal steps in b.
    compute = ComputeModel(EnergyProfile(), CNN, bits=16)
    for price in (compute.forward_energy_j, compute.backward_energy_j):
        e1, e2, e3 = price(1), price(2), price(3)
        assert e3 - e2 == pytest.approx(e2 - e1, rel=1e-9)
    assert compute.forward_time_s(7) == pytest.approx(7 * compute.forward_time_s(1), rel=REL)
    assert compute.forward_energy_j(10) == compute.forward_energy_j(10)  # cached, same value


def test_compute_model_vectorized_matches_scalar():
    compute = ComputeModel(EnergyProfile(), CNN, bits=16)
    fwd = np.array([0, 1, 2, 5, 2])
    bwd = np.array([0, 1, 0, 3, 2])
    energy = compute.energy_j(fwd, bwd, 10)
    time = compute.time_s(fwd, bwd, 10)
    assert energy.shape == time.shape == (5,)
    for i in range(5):
        assert energy[i] == pytest.approx(
            fwd[i] * compute.forward_energy_j(10) + bwd[i] * compute.backward_energy_j(10),
            rel=REL)
        assert time[i] == pytest.approx(
            fwd[i] * compute.forward_time_s(10) + bwd[i] * compute.backward_time_s(10), rel=REL)


@pytest.mark.parametrize("sizes", [[10, 10, 10, 10], [10, 4, 10, 7], 10])
def test_device_prices_are_each_device_s_own_batch_prices(sizes):
    """Per device, the four prices of one pass over its own batch (the scalar prices of
    ``forward_energy_j`` ... by batch size), whether the batch sizes are equal (one price for
    all: a single value the engine broadcasts), differ ([N] arrays), or are one number."""
    compute = ComputeModel(EnergyProfile(), CNN, bits=16)
    prices = compute.device_prices(np.asarray(sizes), 4)
    own = np.broadcast_to(np.asarray(sizes), (4,))
    for k, price in enumerate((compute.forward_energy_j, compute.backward_energy_j,
                               compute.forward_time_s, compute.backward_time_s)):
        assert prices[k].shape == (() if len(set(own.tolist())) == 1 else (4,))
        assert np.broadcast_to(prices[k], (4,)).tolist() == [price(int(b)) for b in own]


def test_compute_model_rejects_bits_above_max_precision():
    with pytest.raises(UserError, match="max_precision_bits"):
        ComputeModel(EnergyProfile(max_precision_bits=16), CNN, bits=32)


def test_radio_energy_is_power_times_airtime():
    assert radio_energy_j(0.2, 0.125e-3) == 0.2 * 0.125e-3
    airtime = np.array([0.0, 1e-3, 2.5])
    np.testing.assert_array_equal(radio_energy_j(0.1995, airtime), 0.1995 * airtime)
