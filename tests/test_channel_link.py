"""Uplink ARQ and MCS, slots, shared spectrum and the downlink, against closed forms and hand
calculations (through the same ``transmit`` calls the engine makes)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import ValidationError

from wirelessfl.channel import (
    Cell,
    ChannelConfig,
    Downlink,
    Uplink,
    arq_delivery_probability,
    mean_arq_attempts,
)
from wirelessfl.channel.mcs import (
    CQI_EFFICIENCY,
    CQI_SNR_THRESHOLDS_DB,
    McsConfig,
    bler,
    select_cqi,
)

N = 20000
SLOT = 0.125e-3


def fixed_cell(snr_db, config: ChannelConfig, n: int = N) -> Cell:
    """n devices whose mean uplink SNR is exactly ``snr_db`` (bypassing geometry)."""
    snr = np.full(n, 10 ** (snr_db / 10))
    return Cell(distances_m=np.full(n, 100.0), uplink_mean_snr=snr, downlink_mean_snr=snr)


# ---- ARQ ---------------------------------------------------------------------------------------

def test_arq_attempts_and_delivery_match_truncated_geometric():
    cfg = ChannelConfig(uplink={"mode": "fixed", "rate_bps": 4e6, "arq": {"max_attempts": 3}})
    cell = fixed_cell(5.0, cfg)  # Rayleigh: p = exp(-(2^2 - 1) / 10^0.5) = 0.387 per attempt
    p = math.exp(-3 / 10 ** 0.5)
    out = Uplink(cell, cfg).transmit(16, np.ones(N, bool), np.random.default_rng(31))
    mean_attempts = 1 + (1 - p) + (1 - p) ** 2  # sum_{k=0}^{L-1} (1 - p)^k
    delivered = 1 - (1 - p) ** 3
    sd_attempts = out.attempts.std()
    assert abs(out.attempts.mean() - mean_attempts) <= 4 * sd_attempts / math.sqrt(N)
    assert abs(out.delivered.mean() - delivered) <= 4 * math.sqrt(delivered * (1 - delivered) / N)
    assert out.attempts.min() == 1 and out.attempts.max() == 3
    np.testing.assert_allclose(out.airtime_s, out.attempts * SLOT)  # every attempt costs a slot
    np.testing.assert_allclose(out.attempt_airtime_s, SLOT)
    # A delivered packet's last attempt succeeded: its SNR carries the rate.
    assert np.all(2e6 * np.log2(1 + out.snr[out.delivered]) >= 4e6)
    assert mean_arq_attempts(p, 3) == pytest.approx(mean_attempts)
    assert arq_delivery_probability(p, 3) == pytest.approx(delivered)


def test_arq_pinned_and_inactive_devices():
    cfg = ChannelConfig(uplink={"mode": "pinned", "delivery_probability": 0.6,
                                "arq": {"max_attempts": 2}})
    cell = fixed_cell(10.0, cfg)
    active = np.arange(N) % 4 != 0
    out = Uplink(cell, cfg).transmit(16, active, np.random.default_rng(32))
    got = out.delivered[active].mean()
    assert abs(got - 0.84) <= 4 * math.sqrt(0.84 * 0.16 / active.sum())  # 1 - 0.4^2
    assert not out.delivered[~active].any() and not out.attempts[~active].any()
    assert not out.airtime_s[~active].any() and not out.attempt_airtime_s[~active].any()


def test_one_attempt_is_todays_draw_order():
    base = {"mode": "pinned", "delivery_probability": 0.5}
    a_cfg = ChannelConfig(uplink=base)
    b_cfg = ChannelConfig(uplink={**base, "arq": {"max_attempts": 1}})
    cell = fixed_cell(10.0, a_cfg, n=100)
    rng = np.random.default_rng(33)
    out = Uplink(cell, b_cfg).transmit(16, np.ones(100, bool), rng)
    ref = np.random.default_rng(33)
    np.testing.assert_array_equal(out.snr, cell.uplink_mean_snr * ref.standard_exponential(100))
    np.testing.assert_array_equal(out.delivered, ref.random(100) < 0.5)
    assert rng.random() == ref.random()


def test_block_fading_retries_see_the_same_channel():
    # All attempts start within one 1 s block: a packet in outage stays in outage.
    cfg = ChannelConfig(fading={"correlation": "block", "coherence_time_s": 1.0},
                        uplink={"mode": "fixed", "rate_bps": 4e6, "arq": {"max_attempts": 4}})
    cell = fixed_cell(5.0, cfg)
    out = Uplink(cell, cfg).transmit(16, np.ones(N, bool), np.random.default_rng(34))
    p = math.exp(-3 / 10 ** 0.5)
    assert abs(out.delivered.mean() - p) <= 4 * math.sqrt(p * (1 - p) / N)
    np.testing.assert_array_equal(out.attempts, np.where(out.delivered, 1, 4))


# ---- MCS ---------------------------------------------------------------------------------------

def test_cqi_selection_from_mean_snr():
    # TS 38.214 Table 5.2.2.1-2 with the 10 % BLER thresholds: the highest CQI whose threshold
    # is <= mean SNR - back-off; below CQI 1's -6.7 dB: CQI 0 (out of range).
    snr = np.array([-10.0, -6.7, -6.6, 0.0, 10.3, 11.0, 22.7, 40.0])
    np.testing.assert_array_equal(select_cqi(snr, McsConfig()), [0, 1, 1, 3, 9, 9, 15, 15])
    np.testing.assert_array_equal(select_cqi(snr, McsConfig(backoff_db=3.0)),
                                  [0, 0, 0, 2, 7, 7, 13, 15])
    assert CQI_EFFICIENCY[0] == 0.1523 and CQI_EFFICIENCY[14] == 5.5547


def test_bler_is_ten_percent_at_threshold():
    for thr in CQI_SNR_THRESHOLDS_DB:
        assert bler(thr, thr, 2.0) == pytest.approx(0.1, abs=1e-12)
    # Logistic in dB: 1 / (1 + 9 e^(s (x - thr))), e.g. 2 dB above with s = 1.5.
    assert bler(2.0, 0.0, 1.5) == pytest.approx(1 / (1 + 9 * math.exp(3.0)))


def test_mcs_delivery_rate_and_outage():
    cfg = ChannelConfig(fading="none", uplink={"mode": "mcs", "mcs": {"backoff_db": 0.0}})
    # Mean SNR exactly at CQI 9's threshold (10.3 dB), no fading: BLER = 0.1.
    cell = fixed_cell(10.3, cfg)
    uplink = Uplink(cell, cfg)
    assert (uplink.cqi == 9).all()
    out = uplink.transmit(10000, np.ones(N, bool), np.random.default_rng(35))
    assert abs(out.delivered.mean() - 0.9) <= 4 * math.sqrt(0.09 / N)
    rate = 2.4063 * 2e6  # efficiency(CQI 9) x B
    np.testing.assert_allclose(out.rate_bps, rate)
    np.testing.assert_allclose(out.airtime_s, math.ceil(10000 / (rate * SLOT)) * SLOT)
    # Below CQI 1: every packet lost, still sent at CQI 1's rate.
    out = Uplink(fixed_cell(-8.0, cfg, 10), cfg).transmit(10000, np.ones(10, bool),
                                                           np.random.default_rng(36))
    assert not out.delivered.any()
    np.testing.assert_allclose(out.rate_bps, 0.1523 * 2e6)
    np.testing.assert_allclose(out.airtime_s, math.ceil(10000 / (0.1523 * 2e6 * SLOT)) * SLOT)


def test_mcs_config_errors():
    with pytest.raises(ValidationError, match="'mcs' is only read in mode 'mcs'"):
        ChannelConfig(uplink={"mode": "fixed", "mcs": {"backoff_db": 1}})
    with pytest.raises(ValidationError, match="15 strictly increasing"):
        ChannelConfig(uplink={"mode": "mcs", "mcs": {"snr_thresholds_db": [1, 2, 3]}})
    assert ChannelConfig(uplink={"mode": "mcs"}).uplink.mcs == McsConfig()


# ---- slots and spectrum ------------------------------------------------------------------------

@pytest.mark.parametrize("mu", [0, 1, 2, 3, 4])
def test_numerology_sets_the_slot(mu):
    # TS 38.211 sec. 4.3.2: 2^mu slots per 1 ms subframe.
    assert ChannelConfig(numerology=mu).slot_s == pytest.approx(1e-3 / 2**mu, rel=1e-15)


def test_numerology_and_slot_must_agree():
    assert ChannelConfig(numerology=3, slot_s=0.125e-3).slot_s == 0.125e-3
    with pytest.raises(ValidationError, match=r"disagrees with numerology 1"):
        ChannelConfig(numerology=1, slot_s=0.125e-3)
    with pytest.raises(ValidationError, match="less than or equal to 4"):
        ChannelConfig(numerology=5)


def test_shared_spectrum_bandwidth_and_mean_snr():
    shared = ChannelConfig(uplink={"spectrum": {"mode": "shared", "pool_bandwidth_hz": 20e6,
                                                "channels": 2}})
    assert shared.uplink.device_bandwidth_hz == 10e6
    assert shared.uplink.spectrum.scheduler == "round-robin"
    tdma = ChannelConfig(uplink={"spectrum": {"mode": "shared", "pool_bandwidth_hz": 20e6}})
    assert tdma.uplink.device_bandwidth_hz == 20e6 and tdma.uplink.spectrum.channels == 1
    # Mean SNR over 10 MHz is 10 log10(10e6 / 2e6) = 6.99 dB below that over 2 MHz.
    a = Cell.from_distances([300.0], ChannelConfig()).uplink_mean_snr[0]
    b = Cell.from_distances([300.0], shared).uplink_mean_snr[0]
    assert 10 * math.log10(a / b) == pytest.approx(10 * math.log10(5), abs=1e-9)
    with pytest.raises(ValidationError, match="needs 'pool_bandwidth_hz'"):
        ChannelConfig(uplink={"spectrum": {"mode": "shared"}})
    with pytest.raises(ValidationError, match="only read in mode 'shared'"):
        ChannelConfig(uplink={"spectrum": {"channels": 4}})
    assert ChannelConfig(uplink={"deadline_s": 0.5, "circuit_power_w": 0.1}).uplink.deadline_s \
        == 0.5


# ---- downlink ----------------------------------------------------------------------------------

def test_downlink_unicast_and_broadcast_airtime():
    cfg = ChannelConfig(downlink={"mode": "unicast"})
    cell = Cell.from_distances([50.0, 200.0, 500.0], cfg)
    receivers = np.array([True, False, True])
    out = Downlink(cell, cfg).transmit(20000, receivers)
    snr_db = [46 - (128.1 + 37.6 * math.log10(d / 1000)) + 109.9897 for d in (50.0, 500.0)]
    each = [math.ceil(20000 / (2e6 * math.log2(1 + 10 ** (s / 10)) * SLOT)) * SLOT
            for s in snr_db]
    np.testing.assert_allclose(out.per_device_airtime_s, [each[0], 0.0, each[1]], rtol=1e-9)
    assert out.airtime_s == pytest.approx(sum(each))
    np.testing.assert_array_equal(out.received, receivers)
    # Broadcast to the same receivers: one transmission at the weaker receiver's (500 m) rate,
    # and 200 m (not a receiver) does not slow it down.
    bcfg = ChannelConfig()
    bcast = Downlink(Cell.from_distances([50.0, 200.0, 500.0], bcfg), bcfg)
    out = bcast.transmit(20000, receivers)
    assert out.airtime_s == pytest.approx(each[1])
    np.testing.assert_allclose(out.per_device_airtime_s, [each[1], 0.0, each[1]])
    only_near = bcast.transmit(20000, np.array([True, False, False]))
    assert only_near.airtime_s == pytest.approx(each[0])
    assert bcast.transmit(16, np.zeros(3, bool)).airtime_s == 0.0
    assert bcast.broadcast(20000) == pytest.approx(each[1])  # all devices: today's method


def test_downlink_loss_matches_rayleigh_outage():
    cfg = ChannelConfig(downlink={"loss": True})
    d = np.repeat([100.0, 500.0], N // 2)
    down = Downlink(Cell.from_distances(d, cfg), cfg)
    out = down.transmit(16, np.ones(N, bool), np.random.default_rng(37))
    # Rate set by the 500 m mean SNR: receiver i loses the packet w.p. 1 - exp(-rho_500 / rho_i).
    rho = {x: 10 ** ((46 - (128.1 + 37.6 * math.log10(x / 1000)) + 109.9897) / 10)
           for x in (100.0, 500.0)}
    for k, x in enumerate((100.0, 500.0)):
        lost = 1 - out.received[k * N // 2:(k + 1) * N // 2].mean()
        expected = 1 - math.exp(-rho[500.0] / rho[x])
        assert abs(lost - expected) <= 4 * math.sqrt(expected * (1 - expected) / (N // 2)) + 1e-3
    with pytest.raises(ValueError, match="pass the downlink's own random generator"):
        down.transmit(16, np.ones(N, bool))
