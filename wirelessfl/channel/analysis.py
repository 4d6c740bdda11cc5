"""Closed forms for checking a profile: ergodic capacity, outage, ARQ, and a one-device link budget.

* Ergodic capacity under Rayleigh fading: E[B log2(1 + rho |h|^2)] = B e^(1/rho) E1(1/rho) / ln 2
  (e.g. Goldsmith, "Wireless Communications", 2005, Sec. 4.2.4), E1 the exponential integral.
* Outage P[rho |h|^2 < x]: Rayleigh 1 - e^(-x/rho); Rician: 2 (K+1) |h|^2 is noncentral chi^2 with
  2 degrees of freedom and noncentrality 2K, so P = F_ncx2(2 (K+1) x / rho; 2, 2K) = 1 - Q1(sqrt(2K),
  sqrt(2 (K+1) x / rho)) (Marcum Q); Nakagami-m: |h|^2 ~ Gamma(m, 1/m), P = F_Gamma(x / rho).
* ARQ with success probability p per attempt and at most L attempts: delivered w.p.
  1 - (1 - p)^L, mean attempts sum_{k=0}^{L-1} (1 - p)^k (truncated geometric).
* Adaptive rate under fading (``expected_adaptive_slots``): the packet takes ceil(Y) slots,
  Y = b / (T max(R, R_min)), R = eta B log2(1 + rho |h|^2 / Gamma) (``link.airtime_s``). For Y >= 0,
  ceil(Y) = #{k >= 0 : k < Y}, so E[ceil(Y)] = sum_{k>=0} P[Y > k] (the tail-sum formula for the
  mean of a non-negative integer variable, e.g. Feller, "An Introduction to Probability Theory and
  Its Applications" I, 3rd ed., 1968, Sec. XI.1), and P[Y > k] = P[R < b / (T k)] =
  F(Gamma (2^(b / (T k eta B)) - 1) / rho) for 0 < k < b / (T R_min), 0 beyond, F the CDF of |h|^2:
  an exact series with finitely many terms. Under Rayleigh fading its terms fall like 1/k (the
  density of |h|^2 is positive at 0, so E[1/log2(1 + rho |h|^2)] is infinite): the mean is finite
  only through the rate floor R_min = ``link.MIN_RATE_BPS`` and grows like ln(b / (T R_min)). This
  is why a few thousand packets miss most of it: the deep fades that dominate it are rare.
  The first ``SERIES_HEAD`` terms are summed one by one, the rest by the Euler-Maclaurin formula
  (Abramowitz and Stegun, "Handbook of Mathematical Functions", 1964, eq. 23.1.30) truncated after
  the trapezoid correction: sum_{k=a}^{z} f(k) = int_a^z f + (f(a) + f(z)) / 2 + E,
  |E| <= |f'(a) - f'(z)| / 12, here below 1e-10 slots (f'(a) ~ f(a) / a, a = 2^17).
* Adaptive mean rate, any fading: E[ln(1 + a X)] = int_0^inf (1 - F(x)) a / (1 + a x) dx
  (integration by parts), a = rho / Gamma; Rayleigh in closed form (``ergodic_capacity_rayleigh_bps``).

``link_budget`` uses these where they apply and otherwise runs ``MC_SAMPLES`` packets through the
same ``Uplink.transmit`` the engine calls. A fading plugin (channel/fading.py) is treated as the
built-ins when it gives its CDF (``cdf(x)``), and by Monte Carlo when it does not.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import integrate, special, stats

from wirelessfl.channel import link
from wirelessfl.channel.cell import Cell, dbm_to_w
from wirelessfl.channel.config import ChannelConfig
from wirelessfl.channel.fading import fading_plugin, k_factor_linear
from wirelessfl.channel.link import Uplink, airtime_s
from wirelessfl.channel.mcs import bler, snr_db
from wirelessfl.errors import UserError

MC_SAMPLES = 20_000  # packets (devices at the same distance) per Monte-Carlo link budget
SERIES_HEAD = 1 << 17  # [D] terms of the airtime series summed one by one (the rest: Euler-Maclaurin)
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


def expected_adaptive_slots(packet_bits: float, slot_s: float, rate_per_log2_bps: float,
                            gap_over_snr: float, cdf, min_rate_bps: float | None = None) -> float:
    """E[ceil(Y)] slots, Y = b (1 - rtol) / (T max(c log2(1 + |h|^2 / g), R_min)): the exact series.

    ``packet_bits`` b [bit], ``slot_s`` T [s], ``rate_per_log2_bps`` c = efficiency x bandwidth
    [bit/s], ``gap_over_snr`` g = Gamma / rho, ``cdf`` the CDF of |h|^2 (vectorized), ``min_rate_bps``
    R_min [bit/s] (default ``link.MIN_RATE_BPS``, read at call time). rtol is the slot count's slack
    in ``link.airtime_s``, so this is the mean of exactly what the engine charges (see the module
    docstring for the series and its error bound).
    """
    floor = link.MIN_RATE_BPS if min_rate_bps is None else float(min_rate_bps)
    bits = float(packet_bits) * (1.0 - link._SLOT_RTOL)
    if bits <= 0.0:
        return 0.0
    last = math.ceil(bits / (slot_s * floor)) - 1  # P[Y > k] = 0 from k = b / (T R_min) on
    scale = bits / (slot_s * rate_per_log2_bps) * math.log(2.0)  # 2^(b/(T k c)) = e^(scale / k)

    def term(k):  # P[Y > k], k >= 1
        with np.errstate(over="ignore"):
            return cdf(gap_over_snr * np.expm1(scale / np.asarray(k, dtype=float)))

    head = min(last, SERIES_HEAD)
    total = 1.0 + math.fsum(term(np.arange(1, head + 1)))
    if last > head:  # Euler-Maclaurin on k = head+1 .. last, the integral in u = ln k
        lo, hi = head + 1, last
        integral, _ = integrate.quad(lambda u: float(term(math.exp(u))) * math.exp(u),
                                     math.log(lo), math.log(hi), epsabs=0.0, epsrel=1e-12,
                                     limit=200)
        total += integral + 0.5 * float(term(lo) + term(hi))
    return total


def budget_method(config: ChannelConfig) -> str:
    """'closed form', 'exact series' or 'monte-carlo': how link_budget computes this profile.

    Adaptive mode always delivers on the first attempt, so its airtime is one packet's over the
    fading distribution whatever the time correlation: the exact series of
    ``expected_adaptive_slots``.
    """
    up, fad = config.uplink, config.fading
    independent = fad.correlation == "iid" or up.arq.max_attempts == 1
    if up.mode == "pinned":
        return "closed form"
    if _plugin_cdf(config) is False:  # a plugin that gives no CDF: only its draws are known
        return "monte-carlo"
    if (up.mode == "fixed" and independent) or fad.model == "none":
        return "closed form"
    if up.mode == "adaptive":
        return "exact series"
    return "monte-carlo"


def link_budget(config: ChannelConfig, distance_m: float, bits: float, los: bool | None = None,
                samples: int = MC_SAMPLES, seed: int = 0) -> dict:
    """One device at ``distance_m`` [m] sending ``bits`` payload bits, at the median path loss.

    Returns mean_snr_db [dB], delivery_probability (after ARQ), expected_airtime_s [s],
    expected_energy_j [J] (= tx power x expected airtime), rate_bps [bit/s] (mean over packets in
    adaptive mode) and mode. Closed form or exact series where ``budget_method`` says so, else
    ``samples`` packets through ``Uplink.transmit`` with generator seed ``seed``.
    """
    up, slot = config.uplink, config.slot_s
    cell = Cell.median([float(distance_m)], config, los)
    rho = float(cell.uplink_mean_snr[0])
    packet_bits = float(bits) + up.header_bits
    bw, attempts = up.device_bandwidth_hz, up.arq.max_attempts
    method = budget_method(config)
    if method == "closed form":
        p, rate = _success_and_rate(config, cell, rho, bw)
        delivery = float(arq_delivery_probability(p, attempts))
        air = float(mean_arq_attempts(p, attempts) * airtime_s(packet_bits, rate, slot))
    elif method == "exact series":
        cdf = _fading_cdf(config, cell)
        gap = 10.0 ** (up.snr_gap_db / 10.0)
        delivery = 1.0
        air = slot * expected_adaptive_slots(packet_bits, slot, up.efficiency * bw, gap / rho, cdf)
        rate = _adaptive_mean_rate_bps(config, cell, rho, bw, cdf)
    else:
        many = Cell(distances_m=np.full(samples, float(distance_m)),
                    uplink_mean_snr=np.full(samples, rho),
                    downlink_mean_snr=np.full(samples, float(cell.downlink_mean_snr[0])),
                    path_loss_db=np.full(samples, float(cell.path_loss_db[0])),
                    los=np.full(samples, bool(cell.los[0])))
        out = Uplink(many, config).transmit(bits, np.ones(samples, dtype=bool),
                                            np.random.default_rng(seed))
        delivery, air = float(out.delivered.mean()), float(out.airtime_s.mean())
        rate = float(out.rate_bps.mean())
    return {"mean_snr_db": float(10.0 * np.log10(rho)), "delivery_probability": delivery,
            "expected_airtime_s": air, "expected_energy_j": float(dbm_to_w(up.tx_power_dbm)) * air,
            "rate_bps": float(rate), "mode": up.mode}


def ergodic_rate_bps(config: ChannelConfig, mean_snr: float, bandwidth_hz: float) -> float:
    """Adaptive mode, Rayleigh: efficiency * B e^(G/rho) E1(G/rho) / ln 2, G the SNR gap."""
    up = config.uplink
    gap = 10.0 ** (up.snr_gap_db / 10.0)
    return float(up.efficiency * ergodic_capacity_rayleigh_bps(mean_snr / gap, bandwidth_hz))


def _fading_model(config: ChannelConfig, cell: Cell) -> str:
    """The device's fading model: rician with K = 0 (an NLOS device when K applies to LOS
    devices only) is rayleigh."""
    model = config.fading.model
    if model == "rician" and k_factor_linear(config.fading, 1, cell.los)[0] == 0:
        return "rayleigh"
    return model


def _plugin_cdf(config: ChannelConfig):
    """A fading plugin's CDF (vectorized in x, checked to lie in [0, 1]); False for a plugin
    without one; None for a built-in model."""
    plugin = fading_plugin(config.fading)
    if plugin is None:
        return None
    cdf = getattr(plugin, "cdf", None)
    if not callable(cdf):
        return False
    name = config.fading.model

    def checked(x):
        try:
            out = np.asarray(cdf(np.asarray(x, dtype=float)), dtype=float)
        except Exception as err:  # noqa: BLE001 - the plugin's own failure, reported as such
            raise UserError(f"fading.model: the fading plugin '{name}' failed in cdf(x): "
                            f"{type(err).__name__}: {str(err)[:200]}") from None
        if out.shape != np.shape(x) or not ((out >= 0) & (out <= 1)).all():
            raise UserError(f"fading.model: the fading plugin '{name}''s cdf(x) must return "
                            "probabilities in [0, 1] of x's shape")
        return out

    return checked


def _fading_cdf(config: ChannelConfig, cell: Cell):
    """P[|h|^2 < x] of the device in ``cell`` (vectorized in x)."""
    plugin = _plugin_cdf(config)
    if plugin:
        return plugin
    model, fad = _fading_model(config, cell), config.fading
    return lambda x: outage_probability(x, 1.0, model, fad.k_factor_db, fad.m)


def _adaptive_mean_rate_bps(config: ChannelConfig, cell: Cell, rho: float, bw: float,
                            cdf) -> float:
    """E[efficiency B log2(1 + rho |h|^2 / Gamma)] [bit/s]: closed form under Rayleigh, else
    int_0^inf (1 - F(x)) a / (1 + a x) dx / ln 2 by quadrature (module docstring)."""
    if _fading_model(config, cell) == "rayleigh":
        return ergodic_rate_bps(config, rho, bw)
    up = config.uplink
    a = rho / 10.0 ** (up.snr_gap_db / 10.0)
    nats, _ = integrate.quad(lambda x: (1.0 - float(cdf(x))) * a / (1.0 + a * x), 0.0, np.inf,
                             epsabs=0.0, epsrel=1e-10, limit=200)
    return float(up.efficiency * bw * nats / math.log(2.0))


def _success_and_rate(config: ChannelConfig, cell: Cell, rho: float, bw: float):
    """Per-attempt success probability and rate [bit/s] in the closed-form cases."""
    up = config.uplink
    if up.mode == "pinned":
        return float(up.delivery_probability), float(up.rate_bps)
    if up.mode == "fixed":
        threshold = 2.0 ** (up.rate_bps / bw) - 1.0
        p = 1.0 - float(_fading_cdf(config, cell)(threshold / rho))
        return p, float(up.rate_bps)
    if up.mode == "adaptive":  # no fading: the mean SNR is the SNR
        gap = 10.0 ** (up.snr_gap_db / 10.0)
        return 1.0, float(up.efficiency * bw * np.log2(1.0 + rho / gap))
    uplink = Uplink(cell, config)  # mcs without fading: BLER at the mean SNR
    if uplink.cqi[0] == 0:
        return 0.0, float(uplink.mcs_rate_bps[0])
    p = 1.0 - float(bler(snr_db(rho), uplink.cqi_threshold_db[0], up.mcs.bler_slope_per_db))
    return p, float(uplink.mcs_rate_bps[0])
