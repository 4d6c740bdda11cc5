"""Fading distributions and their time correlation against theory (KS tests, J0, closed forms).

Outage and capacity are measured through ``Uplink.transmit`` (the engine's code path); the
expected values are written out here with scipy, not taken from ``wirelessfl.channel.analysis``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import ValidationError
from scipy import special, stats

from wirelessfl.channel import (
    Cell,
    ChannelConfig,
    FadingConfig,
    FadingProcess,
    Uplink,
    ergodic_capacity_rayleigh_bps,
    outage_probability,
)

N = 20000


def channel(fading, **uplink) -> ChannelConfig:
    return ChannelConfig(fading=fading, uplink=uplink or {"mode": "fixed"},
                         carrier_frequency_hz=2e9)


def powers(fading, n=N, seed=0, t=0.0) -> np.ndarray:
    return FadingProcess(n, channel(fading), np.random.default_rng(seed)).power(t)


def rho_db(d_m: float) -> float:
    """Mean uplink SNR [dB] of the default profile at d_m: 23 - PL - (N0 + 10 log10 B)."""
    return 23.0 - (128.1 + 37.6 * math.log10(d_m / 1000)) - (-173 + 10 * math.log10(2e6))


# ---- distributions -----------------------------------------------------------------------------

def test_power_distributions_ks():
    assert stats.kstest(powers("rayleigh"), stats.expon.cdf).pvalue > 0.01
    k = 10 ** (6 / 10)  # K = 6 dB: |h| ~ Rice(b = sqrt(2K), scale = sqrt(1 / (2 (K + 1))))
    amp = np.sqrt(powers({"model": "rician", "k_factor_db": 6}))
    rice = stats.rice(math.sqrt(2 * k), scale=math.sqrt(1 / (2 * (k + 1))))
    assert stats.kstest(amp, rice.cdf).pvalue > 0.01
    g = powers({"model": "nakagami", "m": 2.5})
    assert stats.kstest(g, stats.gamma(2.5, scale=1 / 2.5).cdf).pvalue > 0.01
    np.testing.assert_array_equal(powers("none", n=4), np.ones(4))
    # Limiting case: Rician with K = 0 (K_dB = -inf, here -300 dB) is Rayleigh.
    assert stats.kstest(powers({"model": "rician", "k_factor_db": -300}),
                        stats.expon.cdf).pvalue > 0.01


def test_rayleigh_iid_is_one_exponential_draw_per_call():
    rng, ref = np.random.default_rng(8), np.random.default_rng(8)
    process = FadingProcess(50, ChannelConfig(), rng)
    for t in (0.0, 0.5, 0.5):
        np.testing.assert_array_equal(process.power(t), ref.standard_exponential(50))
    assert rng.random() == ref.random()


def test_string_fading_is_the_object_form():
    assert ChannelConfig(fading="rayleigh").fading == FadingConfig(model="rayleigh",
                                                                   correlation="iid")
    assert ChannelConfig(fading="none").fading.model == "none"
    with pytest.raises(ValidationError, match="rayleigh"):
        ChannelConfig(fading="rayleig")


# ---- outage and capacity through the uplink ----------------------------------------------------

def _fixed_outage(fading, d_m: float, rate_bps: float, seed: int) -> float:
    cfg = channel(fading, mode="fixed", rate_bps=rate_bps)
    cell = Cell.from_distances(np.full(N, d_m), cfg)
    out = Uplink(cell, cfg).transmit(16, np.ones(N, bool), np.random.default_rng(seed))
    return 1.0 - out.delivered.mean()


@pytest.mark.parametrize("fading", ["rayleigh", {"model": "rician", "k_factor_db": 5},
                                    {"model": "nakagami", "m": 2.0}])
def test_fixed_rate_outage_matches_closed_form(fading):
    d, rate = 500.0, 12e6  # needs SNR >= 2^6 - 1 = 63 (18 dB) against a mean of 16.2 dB
    x = (2 ** (rate / 2e6) - 1) / 10 ** (rho_db(d) / 10)  # threshold / mean SNR
    if fading == "rayleigh":
        expected = 1 - math.exp(-x)
    elif fading["model"] == "rician":  # 2 (K + 1) |h|^2 ~ noncentral chi^2(2, 2K)
        k = 10 ** 0.5
        expected = stats.ncx2.cdf(2 * (k + 1) * x, 2, 2 * k)
    else:  # |h|^2 ~ Gamma(m, 1/m)
        expected = stats.gamma.cdf(x, 2.0, scale=0.5)
    got = _fixed_outage(fading, d, rate, seed=12)
    assert abs(got - expected) <= 4 * math.sqrt(expected * (1 - expected) / N), (got, expected)
    model = fading if isinstance(fading, str) else fading["model"]
    k_db = fading.get("k_factor_db") if isinstance(fading, dict) else None
    m = fading.get("m") if isinstance(fading, dict) else None
    assert outage_probability(2 ** 6 - 1, 10 ** (rho_db(d) / 10), model, k_db, m) == \
        pytest.approx(expected, rel=1e-9)


def test_ergodic_capacity_with_snr_gap():
    gap_db = 3.0
    cfg = channel("rayleigh", mode="adaptive", snr_gap_db=gap_db)
    cell = Cell.from_distances(np.full(N, 400.0), cfg)
    out = Uplink(cell, cfg).transmit(16, np.ones(N, bool), np.random.default_rng(13))
    rho = 10 ** ((rho_db(400.0) - gap_db) / 10)  # mean SNR over the gap
    expected = 2e6 * math.exp(1 / rho) * special.exp1(1 / rho) / math.log(2)
    assert abs(out.rate_bps.mean() - expected) <= 5 * out.rate_bps.std() / math.sqrt(N)
    np.testing.assert_allclose(out.rate_bps, 2e6 * np.log2(1 + out.snr / 10 ** 0.3))
    assert ergodic_capacity_rayleigh_bps(rho, 2e6) == pytest.approx(expected, rel=1e-12)
    # Far below the noise the closed form switches to its asymptote: e^x E1(x) ~ 1/x.
    assert ergodic_capacity_rayleigh_bps(1e-4, 1.0) == pytest.approx(1e-4 / math.log(2),
                                                                     rel=1e-3)


# ---- time correlation --------------------------------------------------------------------------

@pytest.mark.parametrize("lag_s", [0.005, 0.02, 0.038, 0.06])
def test_gauss_markov_correlation_is_j0(lag_s):
    f_d = 10.0
    cfg = channel({"model": "rayleigh", "correlation": "gauss-markov", "doppler_hz": f_d})
    process = FadingProcess(N, cfg, np.random.default_rng(21))
    h0 = process.coefficient(1.0)
    h1 = process.coefficient(1.0 + lag_s)
    corr = np.mean(np.conj(h0) * h1) / np.mean(np.abs(h0) ** 2)
    expected = special.j0(2 * math.pi * f_d * lag_s)
    assert abs(corr.real - expected) <= 4 / math.sqrt(N), (corr, expected)
    assert abs(corr.imag) <= 4 / math.sqrt(N)
    assert np.mean(np.abs(h1) ** 2) == pytest.approx(1.0, abs=4 * math.sqrt(1 / N))


def test_gauss_markov_rician_and_doppler_from_speed():
    # f_D = v f_c / c: 30 m/s at 2 GHz is 200.14 Hz.
    cfg = ChannelConfig(carrier_frequency_hz=2e9,
                        fading={"model": "rician", "k_factor_db": 10, "correlation":
                                "gauss-markov", "speed_mps": 30.0})
    assert cfg.fading.doppler(2e9) == pytest.approx(30 * 2e9 / 299_792_458.0)
    process = FadingProcess(N, cfg, np.random.default_rng(22))
    h0, h1 = process.coefficient(0.0), process.coefficient(0.001)
    k = 10.0
    los = math.sqrt(k / (k + 1))
    assert np.mean(h1).real == pytest.approx(los, abs=4 / math.sqrt(N))
    s0, s1 = (h0 - los) * math.sqrt(k + 1), (h1 - los) * math.sqrt(k + 1)
    expected = special.j0(2 * math.pi * cfg.fading.doppler(2e9) * 0.001)
    assert np.mean(np.conj(s0) * s1).real == pytest.approx(expected, abs=4 / math.sqrt(N))
    assert np.mean(np.abs(h1) ** 2) == pytest.approx(1.0, abs=0.02)


def test_block_fading_constant_within_and_independent_across_blocks():
    cfg = channel({"model": "rayleigh", "correlation": "block", "coherence_time_s": 0.01})
    process = FadingProcess(N, cfg, np.random.default_rng(23))
    first = process.power(0.0)
    np.testing.assert_array_equal(process.power(0.0099), first)  # same block [0, 10 ms)
    second = process.power(0.0100)  # blocks are aligned to t = 0: a new one starts at 10 ms
    assert not np.any(second == first)
    assert abs(np.corrcoef(first, second)[0, 1]) <= 4 / math.sqrt(N)
    assert stats.kstest(second, stats.expon.cdf).pvalue > 0.01
    # Per-device times: only devices whose block changed get a new value.
    t = np.where(np.arange(N) % 2 == 0, 0.015, 0.021)
    third = process.power(t)
    np.testing.assert_array_equal(third[::2], second[::2])
    assert not np.any(third[1::2] == second[1::2])


def test_fading_config_errors():
    with pytest.raises(ValidationError, match="needs 'k_factor_db'"):
        FadingConfig(model="rician")
    with pytest.raises(ValidationError, match="use correlation 'iid' or 'block' with nakagami"):
        FadingConfig(model="nakagami", m=2, correlation="gauss-markov", doppler_hz=5)
    with pytest.raises(ValidationError, match="needs 'coherence_time_s'"):
        FadingConfig(correlation="block")
    with pytest.raises(ValidationError, match="exactly one of 'doppler_hz'"):
        FadingConfig(correlation="gauss-markov")
    with pytest.raises(ValidationError, match="only read by model 'rician'"):
        FadingConfig(k_factor_db=3)
    with pytest.raises(ValidationError, match="greater than or equal to 0.5"):
        FadingConfig(model="nakagami", m=0.3)
    with pytest.raises(ValidationError, match="speed_mps needs 'carrier_frequency_hz'"):
        ChannelConfig(fading={"correlation": "gauss-markov", "speed_mps": 1.0})
    with pytest.raises(ValidationError, match="k_factor_applies_to 'los' needs"):
        ChannelConfig(fading={"model": "rician", "k_factor_db": 7, "k_factor_applies_to": "los"})
