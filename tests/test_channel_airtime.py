"""The expected adaptive-rate airtime under fading: the exact series against independent truths.

Truths: mpmath at 50 digits (the tail-sum series summed by mpmath's own Euler-Maclaurin routine
``sumem``, with its own derivatives and quadrature; and E[b / R] by ``mpmath.quad``), and the
engine's own ``Uplink.transmit`` over many packets where its Monte-Carlo converges (a rate floor
high enough that the airtime is bounded, so the sample mean has a finite variance).
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from wirelessfl.channel import Cell, ChannelConfig, Uplink, link_budget
from wirelessfl.channel import link as link_module
from wirelessfl.channel.analysis import budget_method, expected_adaptive_slots
from wirelessfl.scenario import catalog

SLOT, BW, BITS = 0.5e-3, 20e6, 16000  # indoor-small-cell: 0.5 ms slots, 20 MHz TDMA pool


def _rayleigh_cdf(x):
    return -np.expm1(-np.asarray(x, dtype=float))


def _mp_expected_slots(bits, slot, bw, mean_snr_db, min_rate):
    """sum_{k>=0} P[Y > k] at 50 digits: 1 + sum_{k=1}^{999} term by term + mpmath.sumem for the
    rest (Rayleigh, no SNR gap, efficiency 1)."""
    with mpmath.workdps(50):
        b = mpmath.mpf(bits) * (1 - mpmath.mpf(link_module._SLOT_RTOL))
        rho = mpmath.mpf(10) ** (mpmath.mpf(mean_snr_db) / 10)
        last = int(mpmath.ceil(b / (mpmath.mpf(slot) * mpmath.mpf(min_rate)))) - 1
        scale = b / (mpmath.mpf(slot) * mpmath.mpf(bw)) * mpmath.log(2)

        def term(k):
            return -mpmath.expm1(-mpmath.expm1(scale / k) / rho)

        head = 1 + mpmath.fsum(term(k) for k in range(1, 1000))
        return head + mpmath.sumem(term, [1000, last])


@pytest.mark.parametrize("mean_snr_db", [-20.0, -4.8, 0.0, 10.0, 30.0])
def test_series_matches_mpmath_at_50_digits(mean_snr_db):
    rho = 10.0 ** (mean_snr_db / 10.0)
    ours = expected_adaptive_slots(BITS, SLOT, BW, 1.0 / rho, _rayleigh_cdf)
    truth = float(_mp_expected_slots(BITS, SLOT, BW, mean_snr_db, link_module.MIN_RATE_BPS))
    assert ours == pytest.approx(truth, rel=1e-9)


def test_issue_case_minus_4_8_db():
    """The issue's numbers at -4.8 dB: E[b / R] = 39.45 ms (mpmath.quad at 50 digits); the engine
    charges whole slots, so the exact mean lies in [E[b / R], E[b / R] + one slot)."""
    rho = 10.0 ** -0.48
    rmin = link_module.MIN_RATE_BPS
    with mpmath.workdps(50):
        r = mpmath.mpf(10) ** mpmath.mpf("-0.48")
        clamp = (mpmath.mpf(2) ** (mpmath.mpf(rmin) / BW) - 1) / r  # |h|^2 below: rate floored
        unslotted = (mpmath.quad(lambda x: BITS / (BW * mpmath.log(1 + r * x, 2)) * mpmath.exp(-x),
                                 [clamp, 1e-9, 1e-6, 1e-3, 1, mpmath.inf])
                     + BITS / mpmath.mpf(rmin) * -mpmath.expm1(-clamp))
    assert float(unslotted) == pytest.approx(39.456e-3, abs=1e-6)
    exact = SLOT * expected_adaptive_slots(BITS, SLOT, BW, 1.0 / rho, _rayleigh_cdf)
    assert float(unslotted) <= exact < float(unslotted) + SLOT
    assert exact == pytest.approx(39.7067e-3, abs=1e-7)


def _profile(**fading):
    doc = catalog.load_mapping("channels", "indoor-small-cell", "link")
    doc["fading"] = {"model": "rayleigh", **fading}
    return ChannelConfig.model_validate(doc)


@pytest.mark.parametrize("fading", [{}, {"model": "rician", "k_factor_db": 7.0},
                                    {"model": "nakagami", "m": 2.0},
                                    {"correlation": "block", "coherence_time_s": 0.05}])
def test_link_budget_matches_the_engine_monte_carlo(monkeypatch, fading):
    """With a rate floor of 2 Mbit/s the airtime is at most 16 slots, so 200,000 packets through
    Uplink.transmit give the mean to about 0.1 %: the exact series must fall within 4 standard
    errors; the mean rate (closed form or quadrature) likewise."""
    monkeypatch.setattr(link_module, "MIN_RATE_BPS", 2e6)
    config = _profile(**fading)
    assert budget_method(config) == "exact series"
    distance, n = 200.0, 200_000
    exact = link_budget(config, distance, BITS, los=False)
    one = Cell.median([distance], config, False)
    many = Cell(distances_m=np.full(n, distance), uplink_mean_snr=np.full(n, one.uplink_mean_snr[0]),
                downlink_mean_snr=np.full(n, one.downlink_mean_snr[0]),
                path_loss_db=np.full(n, one.path_loss_db[0]), los=np.zeros(n, dtype=bool))
    out = Uplink(many, config).transmit(BITS, np.ones(n, dtype=bool), np.random.default_rng(7))
    se = out.airtime_s.std() / math.sqrt(n)
    assert abs(exact["expected_airtime_s"] - out.airtime_s.mean()) <= 4 * se
    assert exact["delivery_probability"] == 1.0 and out.delivered.all()
    rate_se = out.rate_bps.std() / math.sqrt(n)
    assert abs(exact["rate_bps"] - out.rate_bps.mean()) <= 4 * rate_se


def test_deep_fades_dominate_the_mean():
    """Why a Monte-Carlo misses it: at -4.8 dB the packets that need more than 200 slots (rate
    below b / (200 T) = 160 kbit/s, probability under 2 %) carry more than half of the mean
    (flooring the rate there, capping a packet at 200 slots, loses more than half)."""
    rho = 10.0 ** -0.48
    full = expected_adaptive_slots(BITS, SLOT, BW, 1.0 / rho, _rayleigh_cdf)
    bounded = expected_adaptive_slots(BITS, SLOT, BW, 1.0 / rho, _rayleigh_cdf,
                                      min_rate_bps=BITS / (200 * SLOT))
    assert full > 2 * bounded
    assert -math.expm1(-(2 ** (BITS / (200 * SLOT) / BW) - 1) / rho) < 0.02
