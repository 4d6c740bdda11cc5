"""The analog uplink: devices transmit at once on one resource and the base station receives the
channel-weighted sum of their values plus noise (over-the-air aggregation, docs/radio.md
"Analog uplink").

Model (one analog phase of k real values; every choice without a source is marked [D]):

* **Airtime.** One channel use per value over the band B (``uplink.bandwidth_hz``, or the pool's
  bandwidth in shared mode: every device transmits on the whole resource), k / B seconds,
  slot-quantised like a packet (ceil(k / (B slot)) slots): the same for 1 device or 1,000
  (Zhu et al. 2020, "Broadband analog aggregation for low-latency federated edge learning", IEEE
  TWC 19(1), Sec. I: the latency of analog aggregation does not grow with the number of devices).
* **Gains.** Device i's channel is its large-scale gain G_i (path loss and shadowing as the
  profile draws them, the gain ``Cell.uplink_mean_snr`` stands for) times the small-scale
  |h_i|^2 of the profile's fading (unit mean), one draw per phase (block fading over the phase
  [D]; Zhu et al. draw one per sub-channel). Received SNRs are relative to the noise over B,
  sigma^2 = N0 B NF. One real value per complex channel use, on the in-phase branch, with the
  noise of the whole use on it (the papers' real-valued model, conservative by 3 dB [D]).
* **Power control** (the algorithm's ``power_control``: whether its transmitters know their
  channel is part of the method):

  - ``truncated-inversion`` (channel state at the transmitters; Zhu et al. Sec. III-B): a device
    whose gain clears the threshold g_th transmits with power rho_0 sigma^2 / gain, so its
    values arrive with the same received SNR rho_0 as everyone's; the others stay silent. The
    gain is |h_i|^2 (``truncate_on: fading``: the large-scale gain is inverted always; silent
    with probability 1 - exp(-g_th) under Rayleigh at any distance, mean power
    rho_0 sigma^2 E1(g_th) / G_i) or the whole G_i |h_i|^2 (``truncate_on: gain``, Zhu et al.'s
    own rule; far devices are silent more often). rho_0 is the largest the power limit allows
    [D]: on fading, the weakest scheduled device's mean power rho_0 sigma^2 E1(g_th) / G_min
    equals P_max (Zhu et al.'s average-power constraint); on the whole gain, the power at the
    threshold rho_0 sigma^2 / g_th equals P_max (a peak limit: no device ever exceeds P_max).
  - ``large-scale-inversion`` (no instantaneous channel state; Mhanna and Assaad 2024,
    arXiv 2401.17460, whose devices do not know h): a device inverts its large-scale gain only
    (a slow average it can learn [D]) at power rho_0 sigma^2 / G_i, rho_0 = P_max G_min /
    sigma^2, so its values arrive scaled by the amplitude |h_i| (a real Rayleigh amplitude of
    E|h|^2 = 1 has E|h| = sqrt(pi) / 2): the channel becomes part of what the algorithm sees.

* **Cell-interior scheduling** (``interior_radius_m``, Zhu et al. Sec. IV): devices beyond the
  radius stay silent, which raises rho_0 (G_min is then the interior's weakest gain).
* **Amplitude.** Values are mapped to symbols by one common scale a, the largest root mean
  square of the transmitting devices' values [D] (known at both ends, sent as side information
  whose cost is not modelled), so every symbol stream has mean power at most one and the base
  station's estimate of the sum is sum_i w_i x_i + a z, z ~ N(0, 1 / rho_0) per value, with
  w_i = 1 (truncated inversion) or |h_i| (large-scale inversion). The algorithm gets this sum
  and who transmitted (each device signals whether it is silent [D]), never a device's value.
* **Energy.** A transmitting device draws, for the whole airtime, what its energy profile draws
  at the power the control chose (rf / pa_efficiency + its tx circuit + the channel's
  ``circuit_power_w``: the packet uplink's rule, ``DevicePower.draw_at``); a silent one draws
  nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import special

from wirelessfl.channel.cell import Cell, dbm_to_w, noise_power_dbm
from wirelessfl.channel.config import ChannelConfig
from wirelessfl.channel.link import airtime_s
from wirelessfl.contract.port import POWER_CONTROLS

# E|h| of a Rayleigh amplitude with E|h|^2 = 1: sqrt(pi) / 2 (the Rayleigh law's mean,
# sigma sqrt(pi / 2) with 2 sigma^2 = 1).
RAYLEIGH_MEAN_AMPLITUDE = float(np.sqrt(np.pi) / 2.0)


def analog_airtime_s(values: int, bandwidth_hz: float, slot_s: float) -> float:
    """Airtime [s] of ``values`` real values at one channel use each over ``bandwidth_hz``:
    ceil(values / (B slot)) slots (the packet rule of ``link.airtime_s`` at B uses per s)."""
    return float(airtime_s(float(values), bandwidth_hz, slot_s))


def silent_probability_fading(threshold: float) -> float:
    """P(|h|^2 < g_th) under Rayleigh fading (|h|^2 ~ Exp(1)): 1 - exp(-g_th)."""
    return float(-np.expm1(-threshold))


def mean_inversion_power(threshold: float) -> float:
    """E[1{|h|^2 >= g_th} / |h|^2] under Rayleigh fading: the exponential integral E1(g_th), the
    mean transmit power of truncated inversion per unit of rho_0 sigma^2 / G (Zhu et al. 2020)."""
    return float(special.exp1(threshold))


def silent_fraction_disk(threshold: float, alpha: float, radius: float) -> float:
    """P(r^-alpha |h|^2 < g_th) for r uniform by area in a disk of ``radius`` and Rayleigh
    |h|^2: 1 - (2 / (alpha R^2)) g_th^(-2/alpha) gamma(2/alpha, g_th R^alpha) (gamma the lower
    incomplete gamma function), the share truncation on the whole gain silences."""
    a = 2.0 / alpha
    lower = special.gammainc(a, threshold * radius**alpha) * special.gamma(a)
    return float(1.0 - a / radius**2 * threshold ** (-a) * lower)


@dataclass
class AnalogOutcome:
    """One analog phase of the asked devices (arrays aligned with them)."""

    transmitting: np.ndarray  # bool: active, scheduled and not truncated
    weight: np.ndarray  # the factor each transmitter's value arrives with (0 when silent)
    tx_power_w: np.ndarray  # [W] transmit power while on air (0 when silent)
    noise_std: float  # per value, relative to the common amplitude: 1 / sqrt(rho_0)


class AnalogUplink:
    """The analog multiple-access uplink of one cell (module docstring)."""

    def __init__(self, cell: Cell, config: ChannelConfig):
        up = config.uplink
        self.config = config
        self.analog = up.analog_settings
        self.bandwidth_hz = (float(up.spectrum.pool_bandwidth_hz) if up.spectrum.mode == "shared"
                             else float(up.bandwidth_hz))
        self.noise_w = float(dbm_to_w(noise_power_dbm(self.bandwidth_hz, config,
                                                      up.noise_figure_db)))
        self.max_power_w = float(dbm_to_w(up.tx_power_dbm))
        # G_i / sigma^2 over B: the mean SNR at P_tx over the device's own band, rescaled
        snr = cell.uplink_mean_snr * (up.device_bandwidth_hz / self.bandwidth_hz)
        self.gain_over_noise = snr / self.max_power_w  # [1/W]
        self.gain = self.gain_over_noise * self.noise_w  # G_i, linear
        radius = self.analog.interior_radius_m
        self.scheduled = (np.ones(cell.num_devices, dtype=bool) if radius is None
                          else cell.distances_m <= radius)
        self.threshold = 10.0 ** (self.analog.threshold_db / 10.0)
        self.rho0 = {mode: self._receive_snr(mode) for mode in POWER_CONTROLS}

    def _receive_snr(self, power_control: str) -> float:
        """rho_0 of ``power_control``, the received SNR of every transmitter's symbols: the
        largest the power limit allows (module docstring), from the weakest scheduled device's
        large-scale gain."""
        if not self.scheduled.any():
            return 0.0
        weakest = float(self.gain_over_noise[self.scheduled].min())
        if power_control == "large-scale-inversion":
            return self.max_power_w * weakest
        if self.analog.truncate_on == "gain":  # peak limit at the threshold
            return self.max_power_w * self.threshold / self.noise_w
        return self.max_power_w * weakest / mean_inversion_power(self.threshold)

    def airtime_s(self, values: int) -> float:
        """Airtime [s] of one analog phase of ``values`` values (any number of devices)."""
        return analog_airtime_s(values, self.bandwidth_hz, self.config.slot_s)

    def transmit(self, power_control: str, fading_power: np.ndarray, active: np.ndarray,
                 devices) -> AnalogOutcome:
        """Who transmits, with which received weight and transmit power [W], for the asked
        ``devices`` (slice or indices) whose small-scale |h|^2 is ``fading_power``, under
        ``power_control`` (one of POWER_CONTROLS)."""
        if power_control not in POWER_CONTROLS:
            raise ValueError(f"power_control must be one of {POWER_CONTROLS}, got "
                             f"{power_control!r}")
        on = np.asarray(active, dtype=bool) & self.scheduled[devices]
        h2 = np.asarray(fading_power, dtype=float)
        gain = self.gain[devices]
        rho0 = self.rho0[power_control]
        noise_std = 1.0 / np.sqrt(rho0) if rho0 > 0 else np.inf
        if power_control == "large-scale-inversion":
            power = np.where(on, rho0 * self.noise_w / gain, 0.0)
            return AnalogOutcome(on, np.where(on, np.sqrt(h2), 0.0), power, noise_std)
        full = h2 if self.analog.truncate_on == "fading" else gain * h2
        sending = on & (full >= self.threshold)
        power = np.where(sending, rho0 * self.noise_w / np.where(sending, gain * h2, 1.0), 0.0)
        return AnalogOutcome(sending, sending.astype(float), power, noise_std)
