"""What happens to a packet: its rate, airtime [s], retransmissions and whether it is decoded.

Uplink modes (``uplink.mode``), on the instantaneous SNR = mean SNR x |h|^2:

* ``adaptive``: rate = efficiency * B log2(1 + SNR / Gamma); always delivered;
* ``fixed``: rate_bps; lost when B log2(1 + SNR) < rate_bps (outage = erasure; seed 002);
* ``pinned``: rate_bps; delivered with probability p whatever the channel (seed 002's abstraction);
* ``mcs``: CQI chosen from the mean SNR minus a back-off (TS 38.214 Table 5.2.2.1-2), rate =
  efficiency(CQI) * B, delivered with probability 1 - BLER(SNR) (see ``mcs.py``).

ARQ: a lost packet is sent again, up to ``uplink.arq.max_attempts`` transmissions, each on the
channel at that attempt's start time; every attempt costs airtime. The downlink is one broadcast at
the weakest intended receiver's mean-SNR rate, or one unicast per receiver.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wirelessfl.channel.cell import Cell, dbm_to_w
from wirelessfl.channel.config import ChannelConfig
from wirelessfl.channel.fading import FadingProcess
from wirelessfl.channel.mcs import bler, cqi_efficiency, select_cqi, snr_db

# Rates are clamped to at least this [bit/s] before dividing: a faded SNR can be exactly 0.0 in
# float (adaptive mode then gives rate 0). The clamp keeps airtime finite (very long), never inf.
MIN_RATE_BPS = 1e-3
# Relative slack on the slot count, so float rounding of an exact multiple does not add a slot
# (64e5 bits at 10 Mbit/s is 5120 slots of 0.125 ms, not 5121).
_SLOT_RTOL = 1e-12


def airtime_s(bits, rate_bps, slot_s: float) -> np.ndarray:
    """Airtime [s] of ``bits`` at ``rate_bps`` [bit/s], whole slots: ceil(bits / (R slot)) * slot.

    Vectorized over ``bits`` and ``rate_bps``; rates below MIN_RATE_BPS are clamped to it.
    """
    bits = np.asarray(bits, dtype=float)
    rate = np.maximum(np.asarray(rate_bps, dtype=float), MIN_RATE_BPS)
    slots = np.ceil(bits / (rate * slot_s) * (1.0 - _SLOT_RTOL))
    return np.maximum(slots, 0.0) * slot_s


def capacity_bps(snr, bandwidth_hz: float) -> np.ndarray:
    """Shannon capacity [bit/s]: C = B log2(1 + SNR), SNR linear."""
    return bandwidth_hz * np.log2(1.0 + np.asarray(snr, dtype=float))


def rayleigh_delivery_probability(rate_bps, bandwidth_hz, mean_snr) -> np.ndarray:
    """P[B log2(1 + snr |h|^2) >= R] under Rayleigh fading: exp(-(2^(R/B) - 1) / mean_snr)."""
    threshold = 2.0 ** (np.asarray(rate_bps, dtype=float) / bandwidth_hz) - 1.0
    return np.exp(-threshold / np.asarray(mean_snr, dtype=float))


@dataclass
class LinkOutcome:
    """Per-device result of one uplink phase, each of shape [N]."""

    airtime_s: np.ndarray  # [s] total over attempts; 0 for inactive devices
    delivered: np.ndarray  # bool; False for inactive devices
    snr: np.ndarray  # faded SNR of the last attempt, linear (the first for inactive devices)
    attempts: np.ndarray  # int; transmissions made (1..max_attempts), 0 for inactive devices
    attempt_airtime_s: np.ndarray  # [s] airtime of one (the last) attempt; 0 for inactive
    rate_bps: np.ndarray  # [bit/s] rate of the last attempt (every device)


@dataclass
class DownlinkOutcome:
    """Result of one downlink transmission to the intended receivers."""

    airtime_s: float  # [s] total time the base station is on air
    per_device_airtime_s: np.ndarray  # [N] [s] each receiver's listening time (0 if not one)
    received: np.ndarray  # [N] bool; False for devices that were not receivers
    rate_bps: np.ndarray  # [N] [bit/s] rate each device's packet was sent at


class _FadingOwner:
    """A link whose fading process lives as long as the generator that drives it."""

    cell: Cell
    config: ChannelConfig
    _fading: FadingProcess | None = None

    def fading_for(self, rng: np.random.Generator) -> FadingProcess:
        """The link's fading process on ``rng`` (a new process when the generator changes)."""
        if self._fading is None or self._fading.rng is not rng:
            self._fading = FadingProcess(self.cell.num_devices, self.config, rng, self.cell.los)
        return self._fading


class Uplink(_FadingOwner):
    """Every device's uplink to the base station, on its own band (or sub-band of a pool).

    Correlated fading (block, gauss-markov) is state: use one Uplink and one generator per run.
    """

    def __init__(self, cell: Cell, config: ChannelConfig):
        self.cell = cell
        self.config = config
        up = config.uplink
        self.bandwidth_hz = up.device_bandwidth_hz
        if up.mode == "mcs":
            # Link adaptation from the mean SNR (the transmitter does not know the fading).
            self.cqi = select_cqi(snr_db(cell.uplink_mean_snr), up.mcs)  # [N] int, 0 = outage
            thresholds = np.asarray(up.mcs.snr_thresholds_db)
            self.cqi_threshold_db = thresholds[np.maximum(self.cqi, 1) - 1]  # [N] [dB]
            self.mcs_rate_bps = cqi_efficiency(self.cqi) * self.bandwidth_hz  # [N] [bit/s]

    @property
    def tx_power_w(self) -> float:
        """Device transmit power [W]."""
        return float(dbm_to_w(self.config.uplink.tx_power_dbm))

    @property
    def circuit_power_w(self) -> float:
        """Device transmitter circuit power while on air [W] (profile value; 0 by default)."""
        return float(self.config.uplink.circuit_power_w)

    def _attempt(self, snr: np.ndarray, rng: np.random.Generator):
        """Rate [bit/s] and decoded mask of one attempt of every device at faded ``snr``."""
        up, n, bw = self.config.uplink, self.cell.num_devices, self.bandwidth_hz
        if up.mode == "adaptive":
            gap = 10.0 ** (up.snr_gap_db / 10.0)
            return up.efficiency * capacity_bps(snr / gap, bw), np.ones(n, dtype=bool)
        if up.mode == "fixed":
            return np.full(n, up.rate_bps), capacity_bps(snr, bw) >= up.rate_bps
        if up.mode == "pinned":  # the seed's abstraction, p independent of the channel
            return np.full(n, up.rate_bps), rng.random(n) < up.delivery_probability
        error = bler(snr_db(snr), self.cqi_threshold_db, up.mcs.bler_slope_per_db)  # mcs
        ok = (rng.random(n) >= error) & (self.cqi > 0)  # out of range: lost, still on air
        return self.mcs_rate_bps.copy(), ok

    def transmit(self, bits, active, rng: np.random.Generator, now_s=0.0) -> LinkOutcome:
        """Send ``bits`` payload bits (+ header) from every active device, starting at ``now_s``.

        ``now_s`` [s] is the simulated time of the first attempt: a float, or [N] per device
        (e.g. phase start + compute time). Correlated fading is evaluated there, and each retry
        at the end of the previous attempt; iid fading ignores time.

        Per attempt, draws the fading of all N devices (then, in pinned and mcs modes, N
        uniforms), active or not, so the random stream does not depend on who is active or who
        needs a retry. With max_attempts = 1 this is one fading draw and at most one uniform draw.
        """
        up, n = self.config.uplink, self.cell.num_devices
        active = np.asarray(active, dtype=bool)
        if active.shape != (n,):
            raise ValueError(f"active must be a bool array of shape ({n},), got {active.shape}")
        fading = self.fading_for(rng)
        packet_bits = np.asarray(bits, dtype=float) + up.header_bits
        start = np.broadcast_to(np.asarray(now_s, dtype=float), (n,)).copy()  # next attempt [s]
        trying = active.copy()
        delivered = np.zeros(n, dtype=bool)
        attempts = np.zeros(n, dtype=np.int64)
        total = np.zeros(n)
        for k in range(up.arq.max_attempts):
            snr_k = self.cell.uplink_mean_snr * fading.power(start)
            rate_k, ok_k = self._attempt(snr_k, rng)
            air_k = airtime_s(packet_bits, rate_k, self.config.slot_s)
            if k == 0:
                snr, rate, attempt_air = snr_k, rate_k, np.where(active, air_k, 0.0)
            else:
                snr = np.where(trying, snr_k, snr)
                rate = np.where(trying, rate_k, rate)
                attempt_air = np.where(trying, air_k, attempt_air)
            attempts += trying
            total += np.where(trying, air_k, 0.0)
            delivered |= trying & ok_k
            start = np.where(trying, start + air_k, start)
            trying = trying & ~ok_k
        return LinkOutcome(airtime_s=total, delivered=delivered, snr=snr, attempts=attempts,
                           attempt_airtime_s=attempt_air, rate_bps=rate)


class Downlink(_FadingOwner):
    """The base station's transmissions to the devices (broadcast or unicast)."""

    def __init__(self, cell: Cell, config: ChannelConfig):
        self.cell = cell
        self.config = config

    @property
    def tx_power_w(self) -> float:
        """Base-station transmit power [W]."""
        return float(dbm_to_w(self.config.downlink.tx_power_dbm))

    @property
    def circuit_power_w(self) -> float:
        """Base-station transmitter circuit power while on air [W] (profile value; 0 by default)."""
        return float(self.config.downlink.circuit_power_w)

    @property
    def draw_w(self) -> float:
        """What the base station draws while on air [W]: transmit + circuit power."""
        return self.tx_power_w + self.circuit_power_w

    @property
    def rate_bps(self) -> float:
        """Broadcast rate to every device [bit/s]: efficiency * B log2(1 + min_i mean SNR_i)."""
        down = self.config.downlink
        worst = float(np.min(self.cell.downlink_mean_snr))
        return float(down.efficiency * capacity_bps(worst, down.bandwidth_hz))

    def broadcast(self, bits) -> float:
        """Airtime [s] of one broadcast of ``bits`` payload bits (+ header) to every device."""
        packet_bits = float(bits) + self.config.downlink.header_bits
        return float(airtime_s(packet_bits, self.rate_bps, self.config.slot_s))

    def transmit(self, bits, receivers, rng: np.random.Generator | None = None,
                 now_s: float = 0.0, mode: str | None = None) -> DownlinkOutcome:
        """Send ``bits`` payload bits (+ header) to the devices in ``receivers`` (bool [N]).

        broadcast: one transmission at efficiency * B log2(1 + min over receivers of mean SNR);
        unicast: one per receiver at its own mean-SNR rate, back to back (airtime = their sum).
        ``mode``: this transmission's, or None for the profile's ``downlink.mode`` (a packet whose
        content differs per receiver is sent as ``unicast`` whatever the profile says).
        With ``downlink.loss`` a receiver loses the packet when B log2(1 + faded SNR) < rate;
        the fading comes from ``rng`` (a stream of its own, required then) at ``now_s`` [s].
        """
        down, n = self.config.downlink, self.cell.num_devices
        mode = down.mode if mode is None else mode
        receivers = np.asarray(receivers, dtype=bool)
        if receivers.shape != (n,):
            raise ValueError(f"receivers must be a bool array of shape ({n},), got "
                             f"{receivers.shape}")
        packet_bits = float(bits) + down.header_bits
        mean = self.cell.downlink_mean_snr
        if mode == "broadcast":
            worst = float(np.min(mean[receivers])) if receivers.any() else 0.0
            rate = np.full(n, down.efficiency * float(capacity_bps(worst, down.bandwidth_hz)))
            air = float(airtime_s(packet_bits, rate[0], self.config.slot_s)) \
                if receivers.any() else 0.0
            per_device = np.where(receivers, air, 0.0)
            total = air
        else:  # unicast
            rate = down.efficiency * capacity_bps(mean, down.bandwidth_hz)
            per_device = np.where(receivers, airtime_s(packet_bits, rate, self.config.slot_s), 0.0)
            total = float(per_device.sum())
        received = receivers.copy()
        if down.loss:
            if rng is None:
                raise ValueError("downlink.loss is on: pass the downlink's own random generator "
                                 "(rng) so each receiver's fading can be drawn")
            snr = mean * self.fading_for(rng).power(now_s)
            received &= capacity_bps(snr, down.bandwidth_hz) >= rate
        return DownlinkOutcome(airtime_s=total, per_device_airtime_s=per_device,
                               received=received, rate_bps=rate)
