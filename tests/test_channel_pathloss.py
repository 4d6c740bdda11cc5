"""Large-scale models against the standards' formulas, written out again here by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import ValidationError

from wirelessfl.channel import Cell, ChannelConfig, los_probability, path_loss_db, place_devices

C = 299_792_458.0


def cfg(path_loss: dict, fc: float | None = 3.5e9, **top) -> ChannelConfig:
    top.setdefault("cell_radius_m", 500.0)
    top.setdefault("min_distance_m", 10.0)
    return ChannelConfig(path_loss=path_loss, carrier_frequency_hz=fc, **top)


# ---- path loss at hand-computed points ---------------------------------------------------------

def test_uma_nlos_200m_at_3_5ghz():
    # TR 38.901 Table 7.4.1-1, UMa, h_BS = 25, h_UT = 1.5, f_c = 3.5 GHz, d2D = 200 m.
    d3d = math.sqrt(200**2 + 23.5**2)  # 201.376 m
    dbp = 4 * (25 - 1) * (1.5 - 1) * 3.5e9 / 3e8  # 560 m: d2D < d'BP, so PL1
    assert dbp == pytest.approx(560.0)
    pl_los = 28.0 + 22 * math.log10(d3d) + 20 * math.log10(3.5)  # 89.57 dB
    pl_nlos_prime = 13.54 + 39.08 * math.log10(d3d) + 20 * math.log10(3.5) - 0.6 * 0  # 114.46 dB
    expected = max(pl_los, pl_nlos_prime)
    assert expected == pytest.approx(114.46, abs=0.01)
    c = cfg({"model": "3gpp-uma"})
    assert path_loss_db(200.0, c, los=False) == pytest.approx(expected, abs=1e-9)
    assert path_loss_db(200.0, c, los=True) == pytest.approx(pl_los, abs=1e-9)


def test_uma_los_beyond_breakpoint():
    d3d = math.sqrt(1000**2 + 23.5**2)
    dbp = 560.0
    pl2 = (28.0 + 40 * math.log10(d3d) + 20 * math.log10(3.5)
           - 9 * math.log10(dbp**2 + 23.5**2))
    c = cfg({"model": "3gpp-uma"}, cell_radius_m=2000)
    assert path_loss_db(1000.0, c, los=True) == pytest.approx(pl2, abs=1e-9)


def test_umi_and_inh_by_hand():
    # UMi: h_BS = 10, h_UT = 1.5, d'BP = 4 * 9 * 0.5 * 3.5e9 / 3e8 = 210 m; d2D = 100 m.
    d3d = math.sqrt(100**2 + 8.5**2)
    los = 32.4 + 21 * math.log10(d3d) + 20 * math.log10(3.5)
    nlos = max(los, 35.3 * math.log10(d3d) + 22.4 + 21.3 * math.log10(3.5))
    c = cfg({"model": "3gpp-umi"}, cell_radius_m=200)
    assert path_loss_db(100.0, c, los=True) == pytest.approx(los, abs=1e-9)
    assert path_loss_db(100.0, c, los=False) == pytest.approx(nlos, abs=1e-9)
    # UMi beyond its 210 m breakpoint (LOS): PL2 with 9.5 log10(d'BP^2 + (h_BS - h_UT)^2).
    d3d = math.sqrt(400**2 + 8.5**2)
    pl2 = (32.4 + 40 * math.log10(d3d) + 20 * math.log10(3.5)
           - 9.5 * math.log10(210.0**2 + 8.5**2))
    c = cfg({"model": "3gpp-umi"}, cell_radius_m=500)
    assert path_loss_db(400.0, c, los=True) == pytest.approx(pl2, abs=1e-9)
    # InH-Office: h_BS = 3, h_UT = 1, d2D = 20 m.
    d3d = math.sqrt(20**2 + 2**2)
    los = 32.4 + 17.3 * math.log10(d3d) + 20 * math.log10(3.5)
    nlos = max(los, 38.3 * math.log10(d3d) + 17.30 + 24.9 * math.log10(3.5))
    c = cfg({"model": "3gpp-inh"}, cell_radius_m=50, min_distance_m=1)
    assert path_loss_db(20.0, c, los=True) == pytest.approx(los, abs=1e-9)
    assert path_loss_db(20.0, c, los=False) == pytest.approx(nlos, abs=1e-9)


def test_free_space_and_log_distance():
    # Friis at 100 m, 2.4 GHz: 20 log10(4 pi 100 2.4e9 / c) = 80.05 dB.
    friis = 20 * math.log10(4 * math.pi * 100 * 2.4e9 / C)
    assert friis == pytest.approx(80.05, abs=0.01)
    assert path_loss_db(100.0, cfg({"model": "free-space"}, fc=2.4e9)) == pytest.approx(friis)
    # Log-distance, d0 = 1 m at free space, n = 3: PL(100 m) = FSPL(1 m) + 30 * 2.
    fspl_1m = 20 * math.log10(4 * math.pi * 1 * 2.4e9 / C)
    c = cfg({"model": "log-distance", "exponent": 3.0}, fc=2.4e9)
    assert path_loss_db(100.0, c) == pytest.approx(fspl_1m + 60.0)
    # Given PL(d0) needs no frequency: 40 dB at 10 m, n = 3.5, at 1 km: 40 + 35 * 2.
    c = cfg({"model": "log-distance", "exponent": 3.5, "reference_distance_m": 10.0,
             "reference_loss_db": 40.0}, fc=None)
    assert path_loss_db(1000.0, c) == pytest.approx(110.0)


def test_nlos_never_below_los():
    d = np.linspace(10, 5000, 500)
    for model in ("3gpp-uma", "3gpp-umi"):
        c = cfg({"model": model}, cell_radius_m=5000)
        assert np.all(path_loss_db(d, c, los=False) >= path_loss_db(d, c, los=True))


# ---- LOS probability and shadowing -------------------------------------------------------------

def test_los_probability_formulas():
    # TR 38.901 Table 7.4.2-1, outdoor, h_UT <= 13 m.
    assert los_probability("3gpp-uma", 10.0) == 1.0
    d = 100.0
    assert los_probability("3gpp-uma", d) == pytest.approx(
        18 / d + math.exp(-d / 63) * (1 - 18 / d))
    assert los_probability("3gpp-umi", d) == pytest.approx(
        18 / d + math.exp(-d / 36) * (1 - 18 / d))
    assert los_probability("3gpp-inh", 4.0) == pytest.approx(math.exp(-(4.0 - 1.2) / 4.7))
    assert los_probability("3gpp-inh", 20.0) == pytest.approx(
        0.32 * math.exp(-(20.0 - 6.5) / 32.6))
    assert los_probability("3gpp-inh", 20.0, office="open") == pytest.approx(
        math.exp(-(20.0 - 5.0) / 70.8))


def test_drawn_los_fraction_and_shadowing_std():
    n, d = 20000, 100.0
    c = cfg({"model": "3gpp-uma"})
    cell = Cell.from_distances(np.full(n, d), c, np.random.default_rng(11))
    p = 18 / d + math.exp(-d / 63) * (1 - 18 / d)
    assert abs(cell.los.mean() - p) <= 4 * math.sqrt(p * (1 - p) / n)
    # sigma_SF: 4 dB LOS, 6 dB NLOS (TR 38.901 Table 7.4.1-1); sample std within 4 std errors.
    for mask, sigma in ((cell.los, 4.0), (~cell.los, 6.0)):
        s = cell.shadowing_db[mask]
        assert abs(s.std() - sigma) <= 4 * sigma / math.sqrt(2 * s.size)
        assert abs(s.mean()) <= 4 * sigma / math.sqrt(s.size)
    # The mean SNR carries the shadowing: SNR_dB + PL + shadow is the same for every device.
    budget = 10 * np.log10(cell.uplink_mean_snr) + cell.path_loss_db + cell.shadowing_db
    np.testing.assert_allclose(budget, budget[0], atol=1e-9)


def test_configurable_shadowing_for_log_distance_models():
    n = 20000
    c = cfg({"shadowing_std_db": 8.0}, fc=None)
    cell = Cell.from_distances(np.full(n, 300.0), c, np.random.default_rng(3))
    assert abs(cell.shadowing_db.std() - 8.0) <= 4 * 8.0 / math.sqrt(2 * n)
    with pytest.raises(ValueError, match="needs a random generator"):
        Cell.from_distances([300.0], c)
    # The override also turns 3GPP shadowing off, and forced LOS needs no draws at all.
    c = cfg({"model": "3gpp-umi", "shadowing_std_db": 0, "los_condition": "nlos"})
    cell = Cell.from_distances([50.0, 80.0], c)
    assert not cell.los.any() and not cell.shadowing_db.any()


def test_default_cell_draws_only_placement():
    c = ChannelConfig()
    rng, ref = np.random.default_rng(4), np.random.default_rng(4)
    cell = Cell.build(100, c, rng)
    np.testing.assert_array_equal(cell.distances_m, place_devices(100, c, ref))
    assert rng.random() == ref.random()  # nothing else was drawn
    assert not cell.shadowing_db.any() and not cell.los.any()
    # 3GPP: placement first (same distances), then LOS uniforms, then shadowing normals.
    c3 = cfg({"model": "3gpp-uma"}, cell_radius_m=500, min_distance_m=10)
    rng, ref = np.random.default_rng(4), np.random.default_rng(4)
    cell = Cell.build(100, c3, rng)
    d = place_devices(100, c3, ref)
    np.testing.assert_array_equal(cell.distances_m, d)
    np.testing.assert_array_equal(cell.los, ref.random(100) < los_probability("3gpp-uma", d))
    sigma = np.where(cell.los, 4.0, 6.0)
    np.testing.assert_allclose(cell.shadowing_db, sigma * ref.standard_normal(100))


def test_median_cell_picks_the_likelier_los_state():
    c = cfg({"model": "3gpp-uma"})
    # P_LOS(30 m) = 0.6 + e^(-30/63) 0.4 > 0.5: LOS; P_LOS(300 m) < 0.5: NLOS.
    cell = Cell.median([30.0, 300.0], c)
    np.testing.assert_array_equal(cell.los, [True, False])
    assert not cell.shadowing_db.any()
    assert Cell.median([300.0], c, los=True).los[0]


# ---- errors name the field and the fix ---------------------------------------------------------

@pytest.mark.parametrize(("kwargs", "message"), [
    ({"path_loss": {"model": "3gpp-uma"}}, "needs 'carrier_frequency_hz'"),
    ({"path_loss": {"model": "3gpp-uma", "intercept_db": 120}, "carrier_frequency_hz": 3.5e9},
     r"path_loss.intercept_db is not read by model '3gpp-uma' \(only by log-distance-km\)"),
    ({"path_loss": {"model": "log-distance"}, "carrier_frequency_hz": 2e9}, "needs 'exponent'"),
    ({"path_loss": {"model": "3gpp-uma"}, "carrier_frequency_hz": 3.5e9,
      "cell_radius_m": 6000}, r"10 m <= d2D <= 5000 m"),
    ({"path_loss": {"model": "3gpp-uma", "ut_height_m": 20}, "carrier_frequency_hz": 3.5e9},
     r"ut_height_m must be in \[1.5, 13\]"),
    ({"path_loss": {"model": "3gpp-inh"}, "carrier_frequency_hz": 3.5e9},
     r"d3D <= 150 m"),
    ({"path_loss": {"model": "3gpp-umi"}, "carrier_frequency_hz": 200e9},
     r"\[0.5e9, 100e9\]"),
    ({"path_loss": {"model": "3gpp-umi", "los_condition": "sometimes"},
      "carrier_frequency_hz": 3.5e9}, "los_condition"),
])
def test_path_loss_config_errors(kwargs, message):
    with pytest.raises(ValidationError, match=message):
        ChannelConfig(**kwargs)
