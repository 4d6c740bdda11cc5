"""Closed forms for checking a profile: ergodic capacity, outage, ARQ, and a one-device link budget.

* Ergodic capacity under Rayleigh fading: E[B log2(1 + rho |h|^2)] = B e^(1/rho) E1(1/rho) / ln 2
  (e.g. Goldsmith, "Wireless Communications", 2005, Sec. 4.2.4), E1 the exponential integral.
* Outage P[rho |h|^2 < x]: Rayleigh 1 - e^(-x/rho); Rician: 2 (K+1) |h|^2 is noncentral chi^2 with
  2 degrees of freedom and noncentrality 2K, so P = F_ncx2(2 (K+1) x / rho; 2, 2K) = 1 - Q1(sqrt(2K),
  sqrt(2 (K+1) x / rho)) (Marcum Q); Nakagami-m: |h|^2 ~ Gamma(m, 1/m), P = F_Gamma(x / rho).
* ARQ with success probability p per attempt and at most L attempts: delivered w.p.
  1 - (1 - p)^L, mean attempts sum_{k=0}^{L-1} (1 - p)^k (truncated geometric).

``link_budget`` uses these where they apply and otherwise runs ``MC_SAMPLES`` packets through the
same ``Uplink.transmit`` the engine calls.
"""

from __future__ import annotations

import numpy as np
from scipy import special, stats

from wirelessfl.channel.cell import Cell, dbm_to_w
from wirelessfl.channel.config import ChannelConfig
from wirelessfl.channel.fading import k_factor_linear
from wirelessfl.channel.link import Uplink, airtime_s
from wirelessfl.channel.mcs import bler, snr_db

MC_SAMPLES = 20_000  # packets (devices at the same distance) per Monte-Carlo link budget
BUDGET_KEYS = ("mean_snr_db", "delivery_probability", "expected_airtime_s", "expected_energy_j",
               "rate_bps", "mode")


def ergodic_capacity_rayleigh_bps(mean_snr, bandwidth_hz: float) -> np.ndarray:
    """E[B log2(1 + rho |h|^2)], |h|^2 ~ Exp(1): B e^(1/rho) E1(1/rho) / ln 2 [bit/s]."""
    x = 1.0 / np.asarray(mean_snr, dtype=float)
    # e^x E1(x) overflows for large x; there its asymptotic series 1/x (1 - 1/x + 2/x^2) is exact
    # to double precision (x > 700 means rho < -28 dB).
    big = x > 700.0
    xs = np.where(big, 1.0, x)
    scaled = np.where(big, (1.0 - 1.0 / x + 2.0 / x**2) / x, np.exp(xs) * special.exp1(xs))
    return bandwidth_hz * scaled / np.log(2.0)


def outage_probability(threshold_snr, mean_snr, model: str = "rayleigh",
                       k_factor_db: float | None = None, m: float | None = None) -> np.ndarray:
    """P[mean_snr |h|^2 < threshold_snr] for unit-mean fading ``model`` (linear SNRs)."""
    x = np.asarray(threshold_snr, dtype=float) / np.asarray(mean_snr, dtype=float)
    if model == "rayleigh":
        return -np.expm1(-x)
    if model == "rician":
        k = 10.0 ** (float(k_factor_db) / 10.0)
        return stats.ncx2.cdf(2.0 * (k + 1.0) * x, 2, 2.0 * k) if k > 0 else -np.expm1(-x)
    if model == "nakagami":
        return stats.gamma.cdf(x, a=float(m), scale=1.0 / float(m))
    if model == "none":
        return (x > 1.0).astype(float)
    raise ValueError(f"unknown fading model {model!r}")


def arq_delivery_probability(p_success, max_attempts: int) -> np.ndarray:
    """Delivered within ``max_attempts`` independent attempts: 1 - (1 - p)^L."""
    return 1.0 - (1.0 - np.asarray(p_success, dtype=float)) ** int(max_attempts)


def mean_arq_attempts(p_success, max_attempts: int) -> np.ndarray:
    """Mean attempts made: sum_{k=0}^{L-1} (1 - p)^k (truncated geometric)."""
    q = 1.0 - np.asarray(p_success, dtype=float)
    return sum(q**k for k in range(int(max_attempts)))


def budget_method(config: ChannelConfig) -> str:
    """'closed form' or 'monte-carlo': how link_budget computes this profile."""
    up, fad = config.uplink, config.fading
    independent = fad.correlation == "iid" or up.arq.max_attempts == 1
    if up.mode == "pinned" or (up.mode == "fixed" and independent) or fad.model == "none":
        return "closed form"
    return "monte-carlo"


def link_budget(config: ChannelConfig, distance_m: float, bits: float, los: bool | None = None,
                samples: int = MC_SAMPLES, seed: int = 0) -> dict:
    """One device at ``distance_m`` [m] sending ``bits`` payload bits, at the median path loss.

    Returns mean_snr_db [dB], delivery_probability (after ARQ), expected_airtime_s [s],
    expected_energy_j [J] (= tx power x expected airtime), rate_bps [bit/s] (mean over packets in
    adaptive mode) and mode. Closed form where ``budget_method`` says so, else ``samples``
    packets through ``Uplink.transmit`` with generator seed ``seed``.
    """
    up, slot = config.uplink, config.slot_s
    cell = Cell.median([float(distance_m)], config, los)
    rho = float(cell.uplink_mean_snr[0])
    packet_bits = float(bits) + up.header_bits
    bw, attempts = up.device_bandwidth_hz, up.arq.max_attempts
    if budget_method(config) == "closed form":
        p, rate = _success_and_rate(config, cell, rho, bw)
        delivery = float(arq_delivery_probability(p, attempts))
        air = float(mean_arq_attempts(p, attempts) * airtime_s(packet_bits, rate, slot))
    else:
        many = Cell(distances_m=np.full(samples, float(distance_m)),
                    uplink_mean_snr=np.full(samples, rho),
                    downlink_mean_snr=np.full(samples, float(cell.downlink_mean_snr[0])),
                    path_loss_db=np.full(samples, float(cell.path_loss_db[0])),
                    los=np.full(samples, bool(cell.los[0])))
        out = Uplink(many, config).transmit(bits, np.ones(samples, dtype=bool),
                                            np.random.default_rng(seed))
        delivery, air = float(out.delivered.mean()), float(out.airtime_s.mean())
        rate = (float(ergodic_rate_bps(config, rho, bw)) if _rayleigh_adaptive(config, cell)
                else float(out.rate_bps.mean()))
    return {"mean_snr_db": float(10.0 * np.log10(rho)), "delivery_probability": delivery,
            "expected_airtime_s": air, "expected_energy_j": float(dbm_to_w(up.tx_power_dbm)) * air,
            "rate_bps": float(rate), "mode": up.mode}


def ergodic_rate_bps(config: ChannelConfig, mean_snr: float, bandwidth_hz: float) -> float:
    """Adaptive mode, Rayleigh: efficiency * B e^(G/rho) E1(G/rho) / ln 2, G the SNR gap."""
    up = config.uplink
    gap = 10.0 ** (up.snr_gap_db / 10.0)
    return float(up.efficiency * ergodic_capacity_rayleigh_bps(mean_snr / gap, bandwidth_hz))


def _rayleigh_adaptive(config: ChannelConfig, cell: Cell) -> bool:
    k = k_factor_linear(config.fading, 1, cell.los)[0]
    rayleigh = config.fading.model == "rayleigh" or (config.fading.model == "rician" and k == 0)
    return config.uplink.mode == "adaptive" and rayleigh


def _success_and_rate(config: ChannelConfig, cell: Cell, rho: float, bw: float):
    """Per-attempt success probability and rate [bit/s] in the closed-form cases."""
    up, fad = config.uplink, config.fading
    if up.mode == "pinned":
        return float(up.delivery_probability), float(up.rate_bps)
    if up.mode == "fixed":
        model, k_db = fad.model, fad.k_factor_db
        if model == "rician" and k_factor_linear(fad, 1, cell.los)[0] == 0:
            model = "rayleigh"  # an NLOS device when K applies to LOS devices only
        threshold = 2.0 ** (up.rate_bps / bw) - 1.0
        p = 1.0 - float(outage_probability(threshold, rho, model, k_db, fad.m))
        return p, float(up.rate_bps)
    if up.mode == "adaptive":  # no fading: the mean SNR is the SNR
        gap = 10.0 ** (up.snr_gap_db / 10.0)
        return 1.0, float(up.efficiency * bw * np.log2(1.0 + rho / gap))
    uplink = Uplink(cell, config)  # mcs without fading: BLER at the mean SNR
    if uplink.cqi[0] == 0:
        return 0.0, float(uplink.mcs_rate_bps[0])
    p = 1.0 - float(bler(snr_db(rho), uplink.cqi_threshold_db[0], up.mcs.bler_slope_per_db))
    return p, float(uplink.mcs_rate_bps[0])
