"""The CMOS and per-operation compute models, profile dispatch on ``model:``, the catalog
profiles and the transmit power draw, each against arithmetic written out by hand."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from pydantic import ValidationError

from tests.conftest import small_scenario
from wirelessfl.energy import (
    CmosProfile,
    ComputeModel,
    EnergyProfile,
    ModelProfile,
    PerOperationProfile,
    Seed002AcceleratorProfile,
    forward_energy_j,
    transmit_power_draw_w,
)
from wirelessfl.energy.per_operation import precision_for_bits
from wirelessfl.errors import UserError
from wirelessfl.scenario import catalog
from wirelessfl.scenario.loader import resolved_document, scenario_from_document

REL = 1e-12
CATALOG = Path(__file__).resolve().parents[1] / "energy"
# The seed-002 CNN's per-sample counts (tests/test_profiler.py derives them).
CNN = ModelProfile(params=45_362, macs_per_sample=10_514_640, activations_per_sample=25_042,
                   input_size=784)
N_C, O_C, X_IN, D = 105_146_400, 250_420, 7_840, 45_362  # a batch of 10; d once


# ---- CMOS: E = kappa cycles f^2, t = cycles / f (Yang et al. 2021) ----

def test_cmos_batch_of_ten_by_hand():
    profile = CmosProfile(kappa=1e-28, cpu_frequency_hz=2e9, cycles_per_mac=2.0)
    compute = ComputeModel(profile, CNN, bits=16)
    cycles = 2.0 * N_C
    assert compute.forward_energy_j(10) == pytest.approx(1e-28 * cycles * 4e18, rel=REL)
    assert compute.forward_time_s(10) == pytest.approx(cycles / 2e9, rel=REL)
    # Backward = 2 x forward MACs.
    assert compute.backward_energy_j(10) == pytest.approx(2e-28 * cycles * 4e18, rel=REL)
    assert compute.backward_time_s(10) == pytest.approx(2 * cycles / 2e9, rel=REL)


def test_cmos_cycles_per_sample_overrides_macs():
    profile = CmosProfile(kappa=3e-28, cpu_frequency_hz=1.5e9, cycles_per_sample=2e7)
    compute = ComputeModel(profile, CNN, bits=16)
    assert compute.forward_energy_j(10) == pytest.approx(3e-28 * 2e8 * 1.5e9 ** 2, rel=REL)
    assert compute.forward_time_s(10) == pytest.approx(2e8 / 1.5e9, rel=REL)


def test_cmos_is_constant_power_times_time_and_ignores_bits():
    # Limiting case: kappa f^2 per cycle at f cycles per second is the constant power kappa f^3.
    profile = CmosProfile(kappa=1e-28, cpu_frequency_hz=2.84e9)
    compute = ComputeModel(profile, CNN, bits=16)
    power = 1e-28 * 2.84e9 ** 3
    for price, time in ((compute.forward_energy_j, compute.forward_time_s),
                        (compute.backward_energy_j, compute.backward_time_s)):
        assert price(7) == pytest.approx(power * time(7), rel=REL)
    other = ComputeModel(profile, CNN, bits=4)
    assert other.forward_energy_j(10) == compute.forward_energy_j(10)


def test_smartphone_profile_on_the_cnn_by_hand():
    profile = EnergyProfile.model_validate(catalog.load_mapping("energy", "smartphone-soc", "t"))
    compute = ComputeModel(profile, CNN, bits=16)
    assert compute.forward_energy_j(1) == pytest.approx(1e-28 * 10_514_640 * 2.84e9 ** 2, rel=REL)
    assert compute.forward_time_s(1) == pytest.approx(10_514_640 / 2.84e9, rel=REL)


# ---- per-operation (Horowitz, ISSCC 2014) ----

@pytest.mark.parametrize(("bits", "precision"), [
    (32, "fp32"), (17, "fp32"), (16, "fp16"), (9, "fp16"), (8, "int8"), (1, "int8")])
def test_precision_follows_bits(bits, precision):
    assert precision_for_bits(bits) == precision


def test_per_operation_fp16_forward_and_fp32_backward_by_hand():
    compute = ComputeModel(PerOperationProfile(), CNN, bits=16)
    sram_bit, dram_bit = 100e-12 / 64, 2e-9 / 64  # one 64-bit access, per bit
    # Forward at FP16: (d + O_c) x 16 = 4,732,512 bits fit the 8,388,608-bit buffer; the
    # input, 7,840 x 16 bits, comes from DRAM.
    fwd = N_C * 1.5e-12 + (D + O_C) * 16 * sram_bit + X_IN * 16 * dram_bit
    assert compute.forward_energy_j(10) == pytest.approx(fwd, rel=REL)
    # Backward at FP32: 2 N_C MACs; (d + O_c) x 32 = 9,465,024 bits, 1,076,416 past the buffer;
    # read once and written once.
    spill = (D + O_C) * 32 - 8_388_608
    assert spill == 1_076_416
    bwd = 2 * N_C * 4.6e-12 + 2 * 8_388_608 * sram_bit + 2 * spill * dram_bit
    assert compute.backward_energy_j(10) == pytest.approx(bwd, rel=REL)
    assert compute.forward_time_s(10) == pytest.approx(N_C / 4e9, rel=REL)
    assert compute.backward_time_s(10) == pytest.approx(2 * N_C / 4e9, rel=REL)


def test_per_operation_int8_and_fp32_forward():
    profile = PerOperationProfile(sram_bits=1e12)  # everything on chip
    sram_bit, dram_bit = 100e-12 / 64, 2e-9 / 64
    for bits, mac_j, width in ((8, 0.23e-12, 8), (32, 4.6e-12, 32)):
        got = ComputeModel(profile, CNN, bits=bits).forward_energy_j(10)
        want = N_C * mac_j + (D + O_C) * width * sram_bit + X_IN * width * dram_bit
        assert got == pytest.approx(want, rel=REL)


def test_per_operation_rejects_bits_above_fp32():
    with pytest.raises(UserError, match="per-operation"):
        ComputeModel(PerOperationProfile(), CNN, bits=33)


# ---- profile dispatch on model: ----

def test_model_picks_the_subclass():
    assert type(EnergyProfile()) is Seed002AcceleratorProfile
    assert type(EnergyProfile(model="cmos")) is CmosProfile
    assert type(EnergyProfile.model_validate({"model": "per-operation"})) is PerOperationProfile
    assert isinstance(CmosProfile(), EnergyProfile)


@pytest.mark.parametrize(("doc", "where", "says"), [
    ({"model": "cmso"}, "model", "did you mean 'cmos'? choose one of: seed002-accelerator, cmos"),
    ({"model": "cmos", "mac_energy_j": 1e-12}, "mac_energy_j",
     "belongs to compute model 'seed002-accelerator', not 'cmos'"),
    ({"model": "cmos", "cpu_frequency_hz": 2.84}, "cpu_frequency_hz", "2.84e9 for 2.84 GHz"),
    ({"model": "cmos", "kappa": 1.0}, "kappa", "about 1e-28"),
    ({"pa_efficiency": 40}, "pa_efficiency", "write 0.4 for 40 %"),
    ({"pa_efficiency": 0}, "pa_efficiency", "(0, 1]"),
    ({"idle_power_w": -1}, "idle_power_w", "greater than or equal to 0"),
    ({"battery_j": 0}, "battery_j", "greater than 0"),
])
def test_profile_errors_name_the_field_and_the_fix(doc, where, says):
    with pytest.raises(ValidationError) as info:
        EnergyProfile.model_validate(doc)
    errors = info.value.errors()
    assert len(errors) == 1
    assert errors[0]["loc"] == (where,)
    assert says in errors[0]["msg"]


def test_scenario_error_keeps_the_plain_key_path():
    with pytest.raises(UserError, match=r"energy\.kappa: Input should be greater than 0"):
        small_scenario(["energy.kappa=-1"], energy="smartphone-soc")


def test_scenario_with_a_cmos_profile_round_trips():
    sc = small_scenario(energy="smartphone-soc")
    assert type(sc.energy) is CmosProfile
    doc = resolved_document(sc)
    assert doc["energy"]["model"] == "cmos"
    assert doc["energy"]["kappa"] == 1e-28
    assert doc["energy"]["cpu_frequency_hz"] == 2.84e9
    again = scenario_from_document(doc, "resolved.yaml")
    assert again.energy == sc.energy


def test_accelerator_functions_refuse_other_models():
    with pytest.raises(UserError, match="'cmos' compute model"):
        forward_energy_j(CmosProfile(name="phone"), macs=1, activations=1, params=1,
                         input_size=1, bits=16)


# ---- the catalog ----

PROFILES = {"seed002-accelerator": Seed002AcceleratorProfile, "smartphone-soc": CmosProfile,
            "raspberry-pi-4": CmosProfile, "mcu-iot": CmosProfile,
            "horowitz-45nm": PerOperationProfile}


@pytest.mark.parametrize(("name", "cls"), PROFILES.items())
def test_catalog_profile_loads_with_every_number_cited(name, cls):
    assert name in catalog.entries("energy")
    doc = yaml.safe_load((CATALOG / f"{name}.yaml").read_text())
    profile = EnergyProfile.model_validate(catalog.load_mapping("energy", name, "test"))
    assert type(profile) is cls and profile.name == name and profile.description
    numbers = [k for k in cls.model_fields if k not in ("name", "description", "model", "sources")]
    # Every field is written out (YAML 1.1 reads '1e-28' as a string: numbers must be numbers).
    assert all(doc[k] is None or isinstance(doc[k], (int, float)) for k in numbers)
    assert set(profile.sources) == set(numbers)
    compute = ComputeModel(profile, CNN, bits=16)
    assert 0 < compute.forward_energy_j(10) < compute.backward_energy_j(10)
    assert 0 < compute.forward_time_s(10) < compute.backward_time_s(10)


def test_seed002_catalog_profile_prices_as_the_defaults():
    profile = EnergyProfile.model_validate(
        catalog.load_mapping("energy", "seed002-accelerator", "test"))
    for bits in (4, 16, 32):
        a, b = ComputeModel(profile, CNN, bits), ComputeModel(EnergyProfile(), CNN, bits)
        for batch in (1, 10):
            assert a._costs(batch) == b._costs(batch)
    # New hardware fields sit at seed 002's reading: nothing extra is charged.
    assert (profile.idle_power_w, profile.tx_circuit_power_w, profile.pa_efficiency,
            profile.battery_j) == (0.0, 0.0, 1.0, None)


def test_raspberry_pi_kappa_follows_from_its_board_powers():
    pi = EnergyProfile.model_validate(catalog.load_mapping("energy", "raspberry-pi-4", "test"))
    per_core = (6.41 - 2.1) / 4  # W over idle, four busy cores (The MagPi 88)
    assert pi.kappa == pytest.approx(per_core / 1.5e9 ** 3, rel=0.01)
    assert pi.idle_power_w == 2.1


# ---- the radio: rf / pa_efficiency + circuit ----

def test_transmit_power_draw_by_hand():
    profile = CmosProfile(pa_efficiency=0.4, tx_circuit_power_w=1.29)
    assert transmit_power_draw_w(0.2, profile) == pytest.approx(0.2 / 0.4 + 1.29, rel=REL)
    rf = np.array([0.0, 0.1, 0.2])
    np.testing.assert_allclose(transmit_power_draw_w(rf, profile), rf / 0.4 + 1.29, rtol=REL)


def test_transmit_power_draw_defaults_to_the_rf_power():
    # Limiting case: an ideal amplifier and no electronics draw exactly the RF output.
    rf = np.array([0.0, 0.05, 0.1995])
    np.testing.assert_array_equal(transmit_power_draw_w(rf, EnergyProfile()), rf)


def test_mcu_radio_fit_reproduces_its_datasheet_points():
    mcu = EnergyProfile.model_validate(catalog.load_mapping("energy", "mcu-iot", "test"))
    # nRF52840: 6.40 mA at 0 dBm and 16.40 mA at +8 dBm, at 3.0 V.
    assert transmit_power_draw_w(1e-3, mcu) == pytest.approx(6.40e-3 * 3.0, rel=1e-3)
    assert transmit_power_draw_w(10 ** 0.8 * 1e-3, mcu) == pytest.approx(16.40e-3 * 3.0,
                                                                      rel=1e-3)
    assert mcu.kappa * 64e6 ** 3 == pytest.approx(52e-6 * 64 * 3.0, rel=0.01)
    assert math.isclose(mcu.rx_power_w, 6.26e-3 * 3.0)
