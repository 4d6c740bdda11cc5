"""The radio layer against independent truth: hand-computed dB budgets, closed forms, KS tests.

Expected values are written out here (formulas, numbers), never taken from the code under test.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from pydantic import ValidationError
from scipy import special, stats

from wirelessfl.channel import (
    Cell,
    ChannelConfig,
    Downlink,
    Uplink,
    airtime_s,
    dbm_to_w,
    fading_power,
    mean_snr,
    noise_power_dbm,
    path_loss_db,
    place_devices,
    rayleigh_delivery_probability,
    w_to_dbm,
)

CATALOG = Path(__file__).resolve().parents[1] / "channels"


def config(**uplink) -> ChannelConfig:
    return ChannelConfig(uplink=uplink)


# ---- large scale -------------------------------------------------------------------------------

def test_path_loss_by_hand():
    cfg = ChannelConfig()
    # 128.1 + 37.6 log10(0.5) = 128.1 - 37.6 * 0.30103 = 116.7813 dB; at 0.1 km: 128.1 - 37.6.
    assert path_loss_db(500.0, cfg) == pytest.approx(116.78127, abs=1e-4)
    assert path_loss_db(100.0, cfg) == pytest.approx(90.5, abs=1e-12)
    assert path_loss_db(1000.0, cfg) == pytest.approx(128.1, abs=1e-12)


def test_noise_power_and_mean_snr_by_hand():
    cfg = ChannelConfig()
    # -173 dBm/Hz + 10 log10(2e6) = -173 + 63.0103 = -109.9897 dBm.
    assert noise_power_dbm(2e6, cfg) == pytest.approx(-109.98970, abs=1e-4)
    # 23 dBm - 116.7813 dB + 109.9897 dB = 16.2084 dB at the cell edge.
    snr = mean_snr(np.array([500.0]), 23.0, 2e6, cfg)
    assert 10 * np.log10(snr[0]) == pytest.approx(16.2084, abs=1e-3)
    assert snr[0] == pytest.approx(10 ** 1.62084, rel=1e-3)


def test_power_conversions():
    assert dbm_to_w(30.0) == pytest.approx(1.0)
    assert dbm_to_w(23.0) == pytest.approx(0.19953, rel=1e-4)
    assert w_to_dbm(0.001) == pytest.approx(0.0, abs=1e-12)
    assert Uplink(Cell.from_distances([100.0], ChannelConfig()),
                  ChannelConfig()).tx_power_w == pytest.approx(10 ** (-0.7))


def test_placement_within_bounds_and_uniform_by_area():
    cfg = ChannelConfig()
    r0, radius = 10.0, 500.0
    d = place_devices(5000, cfg, np.random.default_rng(1))
    assert d.shape == (5000,)
    assert d.min() >= r0 and d.max() <= radius

    def annulus_cdf(r):
        return (np.asarray(r) ** 2 - r0**2) / (radius**2 - r0**2)

    assert stats.kstest(d, annulus_cdf).pvalue > 0.01
    # And it is not uniform in radius (that would crowd the centre).
    assert stats.kstest(d, stats.uniform(r0, radius - r0).cdf).pvalue < 1e-6


def test_cell_build_and_from_distances():
    cfg = ChannelConfig()
    cell = Cell.build(50, cfg, np.random.default_rng(0))
    assert len(cell) == 50 and cell.uplink_mean_snr.shape == (50,)
    again = Cell.build(50, cfg, np.random.default_rng(0))
    np.testing.assert_array_equal(cell.distances_m, again.distances_m)
    fixed = Cell.from_distances([500.0], cfg)
    # Downlink: 46 dBm - 116.7813 + 109.9897 = 39.2084 dB.
    assert 10 * np.log10(fixed.downlink_mean_snr[0]) == pytest.approx(39.2084, abs=1e-3)
    with pytest.raises(ValueError, match="positive"):
        Cell.from_distances([100.0, 0.0], cfg)


# ---- fading and airtime ------------------------------------------------------------------------

def test_rayleigh_fading_power_is_exponential():
    g = fading_power(20000, "rayleigh", np.random.default_rng(2))
    assert stats.kstest(g, stats.expon.cdf).pvalue > 0.01
    np.testing.assert_array_equal(fading_power(3, "none", np.random.default_rng(2)), np.ones(3))


def test_airtime_slots():
    slot = 0.125e-3
    assert airtime_s(16, 4e6, slot) == slot  # 16 / 500 bits per slot -> one slot exactly
    assert airtime_s(16, 128e3, slot) == slot  # 128 kbit/s carries exactly 16 bits per slot
    assert airtime_s(725792, 4e6, slot) == pytest.approx(1452 * slot, rel=1e-15)
    assert math.ceil(725792 / 500) == 1452
    # Seed 002, Sec. III: 64e5 bits at 10 Mbit/s take 640 ms (5120 slots, not 5121).
    assert airtime_s(64e5, 10e6, slot) == pytest.approx(0.640, rel=1e-12)
    assert airtime_s(0, 4e6, slot) == 0.0
    vec = airtime_s(np.array([16, 1000, 1001]), np.array([4e6, 4e6, 4e6]), slot)
    np.testing.assert_allclose(vec, [slot, 2 * slot, 3 * slot], rtol=1e-15)
    zero_rate = airtime_s(16, 0.0, slot)  # faded SNR 0.0 -> rate 0: clamped, finite
    assert np.isfinite(zero_rate) and zero_rate > 1.0


# ---- uplink modes ------------------------------------------------------------------------------

def test_fixed_rate_delivery_matches_rayleigh_outage():
    cfg = config(mode="fixed", rate_bps=4e6)
    dists, packets = [100.0, 300.0, 500.0], 20000
    cell = Cell.from_distances(np.repeat(dists, packets), cfg)
    out = Uplink(cell, cfg).transmit(16, np.ones(len(cell), bool), np.random.default_rng(3))
    for k, d in enumerate(dists):
        snr_db = 23.0 - (128.1 + 37.6 * math.log10(d / 1000)) - (-173 + 10 * math.log10(2e6))
        p = math.exp(-(2 ** (4e6 / 2e6) - 1) / 10 ** (snr_db / 10))
        got = out.delivered[k * packets:(k + 1) * packets].mean()
        assert abs(got - p) <= 4 * math.sqrt(p * (1 - p) / packets), (d, got, p)
    assert rayleigh_delivery_probability(4e6, 2e6, 10 ** 1.62084) == pytest.approx(
        math.exp(-3 / 10 ** 1.62084))


def test_fixed_rate_at_the_edge_is_an_outage_at_high_rate():
    cfg = config(mode="fixed", rate_bps=14e6)  # needs SNR >= 2^7 - 1 = 127 (21 dB)
    cell = Cell.from_distances(np.full(20000, 500.0), cfg)
    out = Uplink(cell, cfg).transmit(16, np.ones(20000, bool), np.random.default_rng(4))
    p = math.exp(-127 / 10 ** 1.62084)
    assert abs(out.delivered.mean() - p) <= 4 * math.sqrt(p * (1 - p) / 20000)
    np.testing.assert_allclose(out.airtime_s, 0.125e-3)  # outage still costs its airtime


def test_adaptive_mean_capacity_matches_ergodic_closed_form():
    cfg = config(mode="adaptive")
    dists, packets = [100.0, 500.0], 20000
    cell = Cell.from_distances(np.repeat(dists, packets), cfg)
    out = Uplink(cell, cfg).transmit(16, np.ones(len(cell), bool), np.random.default_rng(5))
    assert out.delivered.all()
    for k, d in enumerate(dists):
        snr_db = 23.0 - (128.1 + 37.6 * math.log10(d / 1000)) - (-173 + 10 * math.log10(2e6))
        rho = 10 ** (snr_db / 10)
        expected = 2e6 * math.exp(1 / rho) * special.exp1(1 / rho) / math.log(2)
        cap = 2e6 * np.log2(1 + out.snr[k * packets:(k + 1) * packets])
        assert abs(cap.mean() - expected) <= 5 * cap.std() / math.sqrt(packets), (d,)


def test_adaptive_airtime_and_efficiency():
    cfg = ChannelConfig(fading="none", uplink={"mode": "adaptive", "efficiency": 0.5,
                                                "header_bits": 40})
    cell = Cell.from_distances([500.0], cfg)
    out = Uplink(cell, cfg).transmit(10000, np.ones(1, bool), np.random.default_rng(0))
    rate = 0.5 * 2e6 * math.log2(1 + 10 ** 1.62084)  # no fading: the mean SNR
    slots = math.ceil(10040 / (rate * 0.125e-3))
    assert out.airtime_s[0] == pytest.approx(slots * 0.125e-3)


def test_pinned_delivery_fraction():
    cfg = config(mode="pinned", delivery_probability=0.9)
    n = 20000
    cell = Cell.from_distances(np.full(n, 500.0), cfg)
    out = Uplink(cell, cfg).transmit(16, np.ones(n, bool), np.random.default_rng(6))
    assert abs(out.delivered.mean() - 0.9) <= 4 * math.sqrt(0.9 * 0.1 / n)
    np.testing.assert_allclose(out.airtime_s, 0.125e-3)


@pytest.mark.parametrize("mode", ["adaptive", "fixed", "pinned"])
def test_inactive_devices_and_draws_independent_of_mask(mode):
    extra = {"delivery_probability": 0.5} if mode == "pinned" else {}
    cfg = config(mode=mode, **extra)
    cell = Cell.from_distances(np.linspace(20, 500, 200), cfg)
    uplink = Uplink(cell, cfg)
    everyone = np.ones(200, bool)
    some = np.zeros(200, bool)
    some[::3] = True
    a = uplink.transmit(16, everyone, np.random.default_rng(7))
    b = uplink.transmit(16, some, np.random.default_rng(7))
    np.testing.assert_array_equal(a.snr, b.snr)
    np.testing.assert_array_equal(a.delivered[some], b.delivered[some])
    np.testing.assert_array_equal(a.airtime_s[some], b.airtime_s[some])
    assert (b.airtime_s[~some] == 0).all() and not b.delivered[~some].any()
    np.testing.assert_array_equal(b.attempts, some.astype(int))
    with pytest.raises(ValueError, match="shape"):
        uplink.transmit(16, np.ones(3, bool), np.random.default_rng(7))


# ---- downlink ----------------------------------------------------------------------------------

def test_downlink_rate_is_the_weakest_devices_mean_capacity():
    cfg = ChannelConfig()
    down = Downlink(Cell.from_distances([50.0, 500.0, 200.0], cfg), cfg)
    worst = 10 ** 3.92084  # 39.2084 dB at 500 m (46 dBm)
    assert down.rate_bps == pytest.approx(2e6 * math.log2(1 + worst), rel=1e-6)
    slots = math.ceil(16 / (down.rate_bps * 0.125e-3))
    assert down.broadcast(16) == pytest.approx(slots * 0.125e-3)
    assert down.tx_power_w == pytest.approx(10 ** 1.6)


# ---- config ------------------------------------------------------------------------------------

def test_config_errors():
    with pytest.raises(ValidationError, match="delivery_probability"):
        config(mode="pinned")
    with pytest.raises(ValidationError, match="only read in mode 'pinned'"):
        config(mode="fixed", delivery_probability=0.5)
    with pytest.raises(ValidationError, match="must be smaller than cell_radius_m"):
        ChannelConfig(min_distance_m=500, cell_radius_m=500)
    with pytest.raises(ValidationError, match="extra_forbidden|Extra inputs"):
        ChannelConfig(uplink={"tx_power_db": 20})
    with pytest.raises(ValidationError, match=r"tx_power_dbm.*\[-50, 60\].*Got 100"):
        config(tx_power_dbm=100)
    with pytest.raises(ValidationError, match="not a field"):
        ChannelConfig(sources={"uplink.power": "x"})
    with pytest.raises(ValidationError):
        config(efficiency=0.0)


@pytest.mark.parametrize("name", ["seed002-cell", "seed002-pinned"])
def test_catalog_profiles_load_and_give_every_field(name):
    doc = yaml.safe_load((CATALOG / f"{name}.yaml").read_text())
    cfg = ChannelConfig.model_validate(doc)
    assert cfg.name == name and cfg.cell_radius_m == 500 and cfg.noise_density_dbm_hz == -173
    assert set(doc) == set(ChannelConfig.model_fields)
    assert set(doc["uplink"]) == set(type(cfg.uplink).model_fields)
    assert set(doc["downlink"]) == set(type(cfg.downlink).model_fields)
    if name == "seed002-pinned":
        assert cfg.uplink.mode == "pinned" and cfg.uplink.delivery_probability == 0.9
