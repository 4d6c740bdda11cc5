"""Small-scale fading and what happens to a packet: its airtime [s] and whether it is decoded.

Rayleigh block fading, one draw per packet (seed 002, Sec. V). The uplink's three modes decide the
rate and delivery; the downlink is a reliable broadcast at the rate the weakest device supports.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wirelessfl.channel.cell import Cell, dbm_to_w
from wirelessfl.channel.config import ChannelConfig

# Rates are clamped to at least this [bit/s] before dividing: a faded SNR can be exactly 0.0 in
# float (adaptive mode then gives rate 0). The clamp keeps airtime finite (very long), never inf.
MIN_RATE_BPS = 1e-3
# Relative slack on the slot count, so float rounding of an exact multiple does not add a slot
# (64e5 bits at 10 Mbit/s is 5120 slots of 0.125 ms, not 5121).
_SLOT_RTOL = 1e-12


def fading_power(n: int, kind: str, rng: np.random.Generator) -> np.ndarray:
    """Fading power gains |h|^2, shape [n]: Rayleigh -> Exp(1) (unit mean); none -> ones."""
    if kind == "rayleigh":
        return rng.standard_exponential(int(n))
    if kind == "none":
        return np.ones(int(n))
    raise ValueError(f"unknown fading {kind!r}; choose 'rayleigh' or 'none'")


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

    airtime_s: np.ndarray  # [s]; 0 for inactive devices
    delivered: np.ndarray  # bool; False for inactive devices
    snr: np.ndarray  # faded SNR of this packet, linear (drawn for every device)
    attempts: np.ndarray  # int; 1 for active devices, 0 for inactive (room for ARQ)


class Uplink:
    """Every device's uplink to the base station, on its own dedicated band."""

    def __init__(self, cell: Cell, config: ChannelConfig):
        self.cell = cell
        self.config = config

    @property
    def tx_power_w(self) -> float:
        """Device transmit power [W]."""
        return float(dbm_to_w(self.config.uplink.tx_power_dbm))

    def transmit(self, bits, active, rng: np.random.Generator) -> LinkOutcome:
        """Send ``bits`` payload bits (+ header) from every active device; shape [N] outcome.

        Draws one fading value (and in pinned mode one uniform) for all N devices, active or not,
        so the random stream, and so each device's draw, does not depend on who is active.
        """
        up, n = self.config.uplink, self.cell.num_devices
        active = np.asarray(active, dtype=bool)
        if active.shape != (n,):
            raise ValueError(f"active must be a bool array of shape ({n},), got {active.shape}")
        snr = self.cell.uplink_mean_snr * fading_power(n, self.config.fading, rng)
        packet_bits = np.asarray(bits, dtype=float) + up.header_bits
        if up.mode == "adaptive":
            rate = up.efficiency * capacity_bps(snr, up.bandwidth_hz)
            delivered = np.ones(n, dtype=bool)
        elif up.mode == "fixed":
            rate = np.full(n, up.rate_bps)
            delivered = capacity_bps(snr, up.bandwidth_hz) >= up.rate_bps  # outage = erasure
        else:  # pinned: the seed's abstraction, p independent of the channel
            rate = np.full(n, up.rate_bps)
            delivered = rng.random(n) < up.delivery_probability
        air = np.where(active, airtime_s(packet_bits, rate, self.config.slot_s), 0.0)
        return LinkOutcome(airtime_s=air, delivered=delivered & active, snr=snr,
                           attempts=active.astype(np.int64))


class Downlink:
    """The base station's broadcast to all devices: reliable, at the weakest device's mean rate."""

    def __init__(self, cell: Cell, config: ChannelConfig):
        self.cell = cell
        self.config = config

    @property
    def tx_power_w(self) -> float:
        """Base-station transmit power [W]."""
        return float(dbm_to_w(self.config.downlink.tx_power_dbm))

    @property
    def rate_bps(self) -> float:
        """Broadcast rate [bit/s]: efficiency * B log2(1 + min_i mean SNR_i)."""
        down = self.config.downlink
        worst = float(np.min(self.cell.downlink_mean_snr))
        return float(down.efficiency * capacity_bps(worst, down.bandwidth_hz))

    def broadcast(self, bits) -> float:
        """Airtime [s] of one broadcast of ``bits`` payload bits (+ header); always received."""
        packet_bits = float(bits) + self.config.downlink.header_bits
        return float(airtime_s(packet_bits, self.rate_bps, self.config.slot_s))
